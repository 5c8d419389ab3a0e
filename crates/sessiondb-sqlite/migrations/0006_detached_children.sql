-- sessiondb schema 6: the parent index holds only "detached" children — rows that are not the row
-- right after their parent (branches), and rows whose parent is missing or that are roots. A
-- child right after its parent is found by seq instead, so an append to a linear conversation
-- no longer writes this index. Queries repeat the condition verbatim so SQLite can use it.

DROP INDEX messages_by_parent;
CREATE INDEX messages_by_parent ON messages (namespace, session_id, parent_id)
    WHERE parent_seq IS NULL OR parent_seq <> seq - 1;
