-- sessiondb PostgreSQL schema 2: a session's "detached" rows (roots, orphans, and rows that are
-- not the row right after their parent) by seq. Every other row continues the row before it, so
-- a path is a few runs of consecutive seqs, found with one index probe per run (see
-- `queries::path_runs`) instead of a step per row. Appends to a linear conversation never write
-- this index.

CREATE INDEX messages_detached ON messages (namespace, session_id, seq)
    WHERE parent_seq IS NULL OR parent_seq <> seq - 1;
