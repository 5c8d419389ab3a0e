-- sessiondb PostgreSQL schema 1: the logical schema of the SQLite backend. Every primary key
-- leads with (namespace, session_id) so the tables can be distributed by session (Citus-style);
-- session_id '' is a namespace's template scope, as on SQLite. Identifiers compare byte-wise
-- (COLLATE "C"), as on SQLite, whatever the database's locale: listings and cursors agree.

CREATE TABLE sessions (
    namespace         TEXT COLLATE "C" NOT NULL,
    id                TEXT COLLATE "C" NOT NULL,
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
    stored_messages   BIGINT  NOT NULL DEFAULT 0,
    name              TEXT,
    parent_session_id TEXT,
    model             TEXT,
    source            TEXT,
    user_id           TEXT,
    -- JSON objects as text, byte for byte as written (as on SQLite).
    metadata          TEXT    NOT NULL DEFAULT '{}',
    settings          TEXT    NOT NULL DEFAULT '{}',
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

-- Full-text search: English stemming (Snowball, like SQLite's porter tokenizer) and no stop
-- words, so every word a user searches for can match.
CREATE TEXT SEARCH DICTIONARY sessiondb_stem (TEMPLATE = snowball, LANGUAGE = english);
CREATE TEXT SEARCH CONFIGURATION sessiondb_search (COPY = english);
ALTER TEXT SEARCH CONFIGURATION sessiondb_search
    ALTER MAPPING FOR asciiword, asciihword, hword_asciipart, word, hword, hword_part
    WITH sessiondb_stem;

-- content holds slice 0 of the message's JSON (slices are cut by the core, as on SQLite);
-- search_text is the core's search text, indexed through the generated tsvector.
CREATE TABLE messages (
    namespace      TEXT COLLATE "C" NOT NULL,
    session_id     TEXT COLLATE "C" NOT NULL,
    seq            BIGINT  NOT NULL,
    id             TEXT COLLATE "C" NOT NULL,
    parent_id      TEXT COLLATE "C",
    parent_seq     BIGINT,
    role           TEXT    NOT NULL,
    content        TEXT    NOT NULL,
    content_chunks INTEGER NOT NULL,
    bytes          BIGINT  NOT NULL,
    token_estimate BIGINT  NOT NULL,
    content_hash   BYTEA   NOT NULL,
    created_at     BIGINT  NOT NULL,
    updated_at     BIGINT,
    search_text    TEXT    NOT NULL DEFAULT '',
    search_vector  TSVECTOR GENERATED ALWAYS AS (to_tsvector('sessiondb_search', search_text)) STORED,
    PRIMARY KEY (namespace, session_id, seq)
);
CREATE UNIQUE INDEX messages_by_id ON messages (namespace, session_id, id);
CREATE INDEX messages_by_parent ON messages (namespace, session_id, parent_id);
-- Roots (and orphans) of a session without scanning it.
CREATE INDEX messages_roots ON messages (namespace, session_id, seq) WHERE parent_seq IS NULL;
CREATE INDEX messages_search ON messages USING GIN (search_vector);

CREATE TABLE message_chunks (
    namespace  TEXT COLLATE "C" NOT NULL,
    session_id TEXT COLLATE "C" NOT NULL,
    id         TEXT COLLATE "C" NOT NULL,
    idx        INTEGER NOT NULL,
    content    TEXT    NOT NULL,
    PRIMARY KEY (namespace, session_id, id, idx)
);

CREATE TABLE compactions (
    namespace       TEXT COLLATE "C" NOT NULL,
    session_id      TEXT COLLATE "C" NOT NULL,
    seq             BIGINT NOT NULL,
    id              TEXT COLLATE "C" NOT NULL,
    summary         TEXT   NOT NULL,
    from_message_id TEXT   NOT NULL,
    to_message_id   TEXT   NOT NULL,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (namespace, session_id, seq)
);

CREATE TABLE session_state (
    namespace  TEXT COLLATE "C" NOT NULL,
    session_id TEXT COLLATE "C" NOT NULL,
    key        TEXT COLLATE "C" NOT NULL,
    value      TEXT  NOT NULL,  -- JSON text
    PRIMARY KEY (namespace, session_id, key)
);

-- Payloads are per namespace; a reference row ties one to a message of a session.
CREATE TABLE attachments (
    namespace  TEXT COLLATE "C" NOT NULL,
    hash       TEXT COLLATE "C" NOT NULL,
    media_type TEXT   NOT NULL,
    bytes      BIGINT NOT NULL,
    chunks     INTEGER NOT NULL,
    PRIMARY KEY (namespace, hash)
);
CREATE TABLE attachment_chunks (
    namespace TEXT COLLATE "C" NOT NULL,
    hash      TEXT COLLATE "C" NOT NULL,
    idx       INTEGER NOT NULL,
    data      BYTEA   NOT NULL,
    PRIMARY KEY (namespace, hash, idx)
);
CREATE TABLE attachment_refs (
    namespace  TEXT COLLATE "C" NOT NULL,
    session_id TEXT COLLATE "C" NOT NULL,
    message_id TEXT COLLATE "C" NOT NULL,
    hash       TEXT COLLATE "C" NOT NULL,
    PRIMARY KEY (namespace, session_id, message_id, hash)
);
CREATE INDEX attachment_refs_by_hash ON attachment_refs (namespace, hash);

CREATE TABLE context_blocks (
    namespace   TEXT COLLATE "C" NOT NULL,
    session_id  TEXT COLLATE "C" NOT NULL,
    label       TEXT COLLATE "C" NOT NULL,
    seq         BIGINT NOT NULL,
    kind        TEXT   NOT NULL,
    description TEXT,
    max_tokens  BIGINT,
    content     TEXT   NOT NULL,
    PRIMARY KEY (namespace, session_id, label)
);
CREATE TABLE context_entries (
    namespace     TEXT COLLATE "C" NOT NULL,
    session_id    TEXT COLLATE "C" NOT NULL,
    label         TEXT COLLATE "C" NOT NULL,
    key           TEXT COLLATE "C" NOT NULL,
    content       TEXT NOT NULL,
    description   TEXT,
    search_vector TSVECTOR GENERATED ALWAYS AS (to_tsvector('sessiondb_search', content)) STORED,
    PRIMARY KEY (namespace, session_id, label, key)
);
CREATE INDEX context_entries_search ON context_entries USING GIN (search_vector);
CREATE TABLE context_prompts (
    namespace  TEXT COLLATE "C" NOT NULL,
    session_id TEXT COLLATE "C" NOT NULL,
    prompt     TEXT   NOT NULL,
    frozen_at  BIGINT NOT NULL,
    PRIMARY KEY (namespace, session_id)
);

-- The change feed shared by every instance. Positions form one sequence for the whole database
-- (subscribers may follow every namespace at once), taken from the single counter row with
-- `UPDATE … RETURNING` as the last statement of the writing transaction: writers queue on that
-- row only while they commit, so positions become visible in order and a reader paging
-- `position > n` never skips one that commits later. epoch tells this database's positions
-- apart from any other's.
CREATE TABLE feed_counter (
    id       BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    position BIGINT  NOT NULL,
    epoch    BIGINT  NOT NULL
);
INSERT INTO feed_counter (position, epoch)
VALUES (0, (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT);

-- One row per event: the kind, its small fields as JSON (meta), and the message JSON of
-- append/update/import events as stored.
CREATE TABLE feed (
    namespace  TEXT COLLATE "C" NOT NULL,
    session_id TEXT COLLATE "C" NOT NULL,
    position   BIGINT NOT NULL,
    kind       TEXT   NOT NULL,
    meta       TEXT   NOT NULL,
    message    TEXT,
    PRIMARY KEY (namespace, session_id, position)
);
CREATE UNIQUE INDEX feed_by_position ON feed (position);
