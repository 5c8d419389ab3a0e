-- sessiondb PostgreSQL schema 1: the logical schema of the SQLite backend. Every primary key
-- leads with (namespace, session_id) so the tables can be distributed by session (Citus-style);
-- session_id '' is a namespace's template scope, as on SQLite.

CREATE TABLE sessions (
    namespace         TEXT    NOT NULL,
    id                TEXT    NOT NULL,
    created_at        BIGINT  NOT NULL,
    updated_at        BIGINT  NOT NULL,
    last_message_at   BIGINT,
    next_seq          BIGINT  NOT NULL,
    leaf_id           TEXT,
    leaf_seq          BIGINT,
    path_len          BIGINT  NOT NULL DEFAULT 0,
    path_tokens       BIGINT  NOT NULL DEFAULT 0,
    path_bytes        BIGINT  NOT NULL DEFAULT 0,
    path_capped       BOOLEAN NOT NULL DEFAULT FALSE,
    path_head_seq     BIGINT,
    path_dense        BOOLEAN NOT NULL DEFAULT TRUE,
    path_epoch        BIGINT  NOT NULL DEFAULT 0,
    stored_messages   BIGINT  NOT NULL DEFAULT 0,
    name              TEXT,
    parent_session_id TEXT,
    model             TEXT,
    source            TEXT,
    user_id           TEXT,
    metadata          JSONB   NOT NULL DEFAULT '{}',
    settings          JSONB   NOT NULL DEFAULT '{}',
    end_reason        TEXT,
    input_tokens      BIGINT  NOT NULL DEFAULT 0,
    output_tokens     BIGINT  NOT NULL DEFAULT 0,
    cost              DOUBLE PRECISION NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, id)
);
CREATE INDEX sessions_by_updated ON sessions (namespace, updated_at, id);
CREATE INDEX sessions_by_created ON sessions (namespace, created_at, id);
CREATE INDEX sessions_by_last_message
    ON sessions (namespace, (coalesce(last_message_at, created_at)), id);
CREATE INDEX sessions_by_user_updated ON sessions (namespace, user_id, updated_at, id)
    WHERE user_id IS NOT NULL;
CREATE INDEX sessions_by_user_created ON sessions (namespace, user_id, created_at, id)
    WHERE user_id IS NOT NULL;
CREATE INDEX sessions_by_user_last_message
    ON sessions (namespace, user_id, (coalesce(last_message_at, created_at)), id)
    WHERE user_id IS NOT NULL;

-- content holds slice 0 of the message's JSON (slices are cut by the core, as on SQLite);
-- search_text is the core's search text, indexed through the generated tsvector.
CREATE TABLE messages (
    namespace      TEXT    NOT NULL,
    session_id     TEXT    NOT NULL,
    seq            BIGINT  NOT NULL,
    id             TEXT    NOT NULL,
    parent_id      TEXT,
    parent_seq     BIGINT,
    role           TEXT    NOT NULL,
    content        TEXT    NOT NULL,
    content_chunks INTEGER NOT NULL,
    bytes          BIGINT  NOT NULL,
    token_estimate BIGINT  NOT NULL,
    content_hash   BYTEA   NOT NULL,
    created_at     BIGINT  NOT NULL,
    updated_at     BIGINT,
    path_len       BIGINT,
    path_tokens    BIGINT,
    path_bytes     BIGINT,
    path_epoch     BIGINT,
    search_text    TEXT    NOT NULL DEFAULT '',
    search_vector  TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', search_text)) STORED,
    PRIMARY KEY (namespace, session_id, seq)
);
CREATE UNIQUE INDEX messages_by_id ON messages (namespace, session_id, id);
CREATE INDEX messages_by_parent ON messages (namespace, session_id, parent_id);
CREATE INDEX messages_path
    ON messages (namespace, session_id, seq, parent_seq) INCLUDE (id, role, bytes, token_estimate);
CREATE INDEX messages_search ON messages USING GIN (search_vector);

CREATE TABLE message_chunks (
    namespace  TEXT    NOT NULL,
    session_id TEXT    NOT NULL,
    id         TEXT    NOT NULL,
    idx        INTEGER NOT NULL,
    content    TEXT    NOT NULL,
    PRIMARY KEY (namespace, session_id, id, idx)
);

CREATE TABLE compactions (
    namespace       TEXT   NOT NULL,
    session_id      TEXT   NOT NULL,
    seq             BIGINT NOT NULL,
    id              TEXT   NOT NULL,
    summary         TEXT   NOT NULL,
    from_message_id TEXT   NOT NULL,
    to_message_id   TEXT   NOT NULL,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (namespace, session_id, seq)
);

CREATE TABLE session_state (
    namespace  TEXT  NOT NULL,
    session_id TEXT  NOT NULL,
    key        TEXT  NOT NULL,
    value      JSONB NOT NULL,
    PRIMARY KEY (namespace, session_id, key)
);

-- Payloads are per namespace; a reference row ties one to a message of a session.
CREATE TABLE attachments (
    namespace  TEXT   NOT NULL,
    hash       TEXT   NOT NULL,
    media_type TEXT   NOT NULL,
    bytes      BIGINT NOT NULL,
    chunks     INTEGER NOT NULL,
    PRIMARY KEY (namespace, hash)
);
CREATE TABLE attachment_chunks (
    namespace TEXT    NOT NULL,
    hash      TEXT    NOT NULL,
    idx       INTEGER NOT NULL,
    data      BYTEA   NOT NULL,
    PRIMARY KEY (namespace, hash, idx)
);
CREATE TABLE attachment_refs (
    namespace  TEXT NOT NULL,
    session_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    hash       TEXT NOT NULL,
    PRIMARY KEY (namespace, session_id, message_id, hash)
);
CREATE INDEX attachment_refs_by_hash ON attachment_refs (namespace, hash);

CREATE TABLE context_blocks (
    namespace   TEXT   NOT NULL,
    session_id  TEXT   NOT NULL,
    label       TEXT   NOT NULL,
    seq         BIGINT NOT NULL,
    kind        TEXT   NOT NULL,
    description TEXT,
    max_tokens  BIGINT,
    content     TEXT   NOT NULL,
    PRIMARY KEY (namespace, session_id, label)
);
CREATE TABLE context_entries (
    namespace     TEXT NOT NULL,
    session_id    TEXT NOT NULL,
    label         TEXT NOT NULL,
    key           TEXT NOT NULL,
    content       TEXT NOT NULL,
    description   TEXT,
    search_vector TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    PRIMARY KEY (namespace, session_id, label, key)
);
CREATE INDEX context_entries_search ON context_entries USING GIN (search_vector);
CREATE TABLE context_prompts (
    namespace  TEXT   NOT NULL,
    session_id TEXT   NOT NULL,
    prompt     TEXT   NOT NULL,
    frozen_at  BIGINT NOT NULL,
    PRIMARY KEY (namespace, session_id)
);

-- The change feed shared by every instance, per namespace (the SSE streams are per namespace
-- or per session; these two tables distribute by namespace). A position comes from the
-- namespace's counter row, taken with `UPDATE … RETURNING` in the writing transaction: writers
-- of a namespace queue on that row, so positions commit in order and a reader paging
-- `position > n` never skips one that commits later.
CREATE TABLE feed_counters (
    namespace TEXT   NOT NULL PRIMARY KEY,
    position  BIGINT NOT NULL
);
CREATE TABLE feed (
    namespace  TEXT   NOT NULL,
    session_id TEXT   NOT NULL,
    position   BIGINT NOT NULL,
    change     JSONB  NOT NULL,
    at         BIGINT NOT NULL,
    PRIMARY KEY (namespace, session_id, position)
);
CREATE UNIQUE INDEX feed_by_position ON feed (namespace, position);
