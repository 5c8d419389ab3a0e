-- sessiondb schema 2: the session registry record, compaction overlays and per-session state.

ALTER TABLE sessions ADD COLUMN name TEXT;
ALTER TABLE sessions ADD COLUMN parent_session_id TEXT;
ALTER TABLE sessions ADD COLUMN model TEXT;
ALTER TABLE sessions ADD COLUMN source TEXT;
ALTER TABLE sessions ADD COLUMN user_id TEXT;
-- JSON objects as text.
ALTER TABLE sessions ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD COLUMN settings TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD COLUMN end_reason TEXT;
ALTER TABLE sessions ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN cost REAL NOT NULL DEFAULT 0;

-- Listings page by (sort value, id) within a namespace.
CREATE INDEX sessions_by_updated ON sessions (namespace, updated_at, id);
CREATE INDEX sessions_by_created ON sessions (namespace, created_at, id);
CREATE INDEX sessions_by_last_message
    ON sessions (namespace, coalesce(last_message_at, created_at), id);
CREATE INDEX sessions_by_user ON sessions (namespace, user_id);

-- Roots (and orphans) of a session without scanning it.
CREATE INDEX messages_roots ON messages (namespace, session_id, seq) WHERE parent_seq IS NULL;

-- seq orders a session's compactions by creation.
CREATE TABLE compactions (
    namespace       TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    id              TEXT    NOT NULL,
    summary         TEXT    NOT NULL,
    from_message_id TEXT    NOT NULL,
    to_message_id   TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (namespace, session_id, seq)
) WITHOUT ROWID;

-- value is JSON text.
CREATE TABLE session_state (
    namespace  TEXT NOT NULL,
    session_id TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    PRIMARY KEY (namespace, session_id, key)
) WITHOUT ROWID;
