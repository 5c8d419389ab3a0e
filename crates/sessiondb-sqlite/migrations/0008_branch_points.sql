-- sessiondb schema 8: a session's "detached" rows (roots, orphans, and rows that are not the row
-- right after their parent) by seq. Every other row continues the row before it, so a path is a
-- few runs of consecutive seqs, one per branch point, and a reader finds them with one seek per
-- run instead of reading the path's rows (planning compaction overlays on a 10,000-row path
-- read every row before). Appends to a linear conversation never write this index.

CREATE INDEX messages_detached ON messages (namespace, session_id, seq)
    WHERE parent_seq IS NULL OR parent_seq <> seq - 1;
