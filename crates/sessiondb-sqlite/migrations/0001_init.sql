-- sessiondb schema 1. Released migrations are never edited; later changes are new files.

CREATE TABLE store_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

-- One row per session that was ever written. Holds the active leaf, the next seq, and the
-- aggregates of the active path (capped like path reads; path_head_seq is its oldest row) so
-- that stats and token checks are O(1).
CREATE TABLE sessions (
    namespace       TEXT    NOT NULL,
    id              TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    last_message_at INTEGER,
    next_seq        INTEGER NOT NULL,
    leaf_id         TEXT,
    leaf_seq        INTEGER,
    path_len        INTEGER NOT NULL,
    path_tokens     INTEGER NOT NULL,
    path_bytes      INTEGER NOT NULL,
    path_capped     INTEGER NOT NULL,
    path_head_seq   INTEGER,
    -- 1 when the active path is exactly the rows with seq >= path_head_seq (a linear
    -- conversation), so forward reads need no walk.
    path_dense      INTEGER NOT NULL,
    path_epoch      INTEGER NOT NULL,
    stored_messages INTEGER NOT NULL,
    PRIMARY KEY (namespace, id)
) WITHOUT ROWID;

-- Messages are clustered by seq, so a path (mostly ascending seqs) is read by range scans.
-- content holds slice 0 of the message's JSON as reads return it (body plus createdAt and
-- updatedAt); content_chunks continuation slices follow in message_chunks (idx
-- 1..=content_chunks). bytes is the UTF-8 length of the body alone (what budgets count);
-- content_hash is the SHA-256 of the body.
-- parent_seq is the parent's seq, NULL while the parent is missing (an import may name a
-- parent that arrives later; parent_id keeps the link and parent_seq is filled in then).
-- path_len/path_tokens/path_bytes total the (uncapped) path from its root to this row; they are
-- valid while path_epoch equals the session's path_epoch, which moves whenever a write could
-- change the totals of rows below another (interior updates, deletes, adopted orphans).
CREATE TABLE messages (
    namespace      TEXT    NOT NULL,
    session_id     TEXT    NOT NULL,
    seq            INTEGER NOT NULL,
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
    path_epoch     INTEGER,
    PRIMARY KEY (namespace, session_id, seq)
) WITHOUT ROWID;

CREATE UNIQUE INDEX messages_by_id ON messages (namespace, session_id, id);
-- Entries end with the primary key, so children come back in seq order.
CREATE INDEX messages_by_parent ON messages (namespace, session_id, parent_id);
-- Covers path walks and row stats, so they never read message content pages.
CREATE INDEX messages_path ON messages (namespace, session_id, seq, parent_seq, id, role, bytes, token_estimate);

CREATE TABLE message_chunks (
    namespace  TEXT    NOT NULL,
    session_id TEXT    NOT NULL,
    id         TEXT    NOT NULL,
    idx        INTEGER NOT NULL,
    content    TEXT    NOT NULL,
    PRIMARY KEY (namespace, session_id, id, idx)
) WITHOUT ROWID;
