-- sessiondb schema 13: `messages` becomes a rowid table keyed by `k`, the session's number
-- (`sessions.number`, from 1) times 2^32 plus the row's seq, so a session's rows stay together
-- in seq order (as under the old key, namespace, session_id and seq) while the key is one
-- integer. The rows no longer repeat the namespace and the session id, the table's interior
-- pages hold 9-byte keys instead of the two texts, and an append at the end of the table's last
-- leaf starts a new page instead of rebalancing three (SQLite's `balance_quick` is for rowid
-- tables only). `seq` is computed from `k` and stored nowhere.
--
-- Ids are unique within a session by the write rules (the writer is the only one); the id index
-- keys the id alone, its entries carry `k`, so a look-up names the session by its range of k.

ALTER TABLE sessions ADD COLUMN number INTEGER;
UPDATE sessions SET number = numbered.n
  FROM (SELECT namespace, id, row_number() OVER (ORDER BY namespace, id) AS n FROM sessions)
       AS numbered
 WHERE sessions.namespace = numbered.namespace AND sessions.id = numbered.id;
CREATE UNIQUE INDEX sessions_by_number ON sessions (number);

CREATE TABLE messages_v13 (
    k              INTEGER PRIMARY KEY,
    seq            INTEGER GENERATED ALWAYS AS (k & 4294967295) VIRTUAL,
    id             TEXT    NOT NULL,
    parent_id      TEXT,
    parent_seq     INTEGER,
    role           TEXT    NOT NULL,
    content        TEXT    NOT NULL,
    content_chunks INTEGER NOT NULL,
    bytes          INTEGER NOT NULL,
    token_estimate INTEGER NOT NULL,
    content_hash   BLOB    NOT NULL,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER,
    path_len       INTEGER,
    path_tokens    INTEGER,
    path_bytes     INTEGER,
    path_epoch     INTEGER
);

INSERT INTO messages_v13 (k, id, parent_id, parent_seq, role, content, content_chunks, bytes,
                          token_estimate, content_hash, created_at, updated_at, path_len,
                          path_tokens, path_bytes, path_epoch)
     SELECT (s.number << 32) + m.seq, m.id, m.parent_id, m.parent_seq, m.role, m.content,
            m.content_chunks, m.bytes, m.token_estimate, m.content_hash, m.created_at,
            m.updated_at, m.path_len, m.path_tokens, m.path_bytes, m.path_epoch
       FROM messages m JOIN sessions s ON s.namespace = m.namespace AND s.id = m.session_id
      ORDER BY 1;

-- Every row has its session (a session's row is written with its first write and deleted only
-- with all its messages); a row that had none would be lost here, so the migration fails
-- instead, leaving the file as it was.
CREATE TEMP TABLE migration_13_check (every_row_moved INTEGER CHECK (every_row_moved));
INSERT INTO migration_13_check
     SELECT (SELECT count(*) FROM messages) = (SELECT count(*) FROM messages_v13);
DROP TABLE migration_13_check;

DROP TABLE messages;
ALTER TABLE messages_v13 RENAME TO messages;

CREATE INDEX messages_by_id ON messages (id);
CREATE INDEX messages_by_parent ON messages (parent_id)
    WHERE parent_seq IS NULL OR parent_seq <> seq - 1;
CREATE INDEX messages_detached ON messages (k)
    WHERE parent_seq IS NULL OR parent_seq <> seq - 1;
CREATE INDEX messages_roots ON messages (k) WHERE parent_seq IS NULL;
