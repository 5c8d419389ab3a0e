-- sessiondb schema 5: context blocks, their keyed entries, and frozen system prompts.
-- session_id '' is the namespace's template scope (no session has an empty id).

-- seq orders a scope's blocks by creation; a redefined block keeps its seq.
CREATE TABLE context_blocks (
    namespace   TEXT    NOT NULL,
    session_id  TEXT    NOT NULL,
    label       TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    kind        TEXT    NOT NULL,  -- readonly | writable | skill | search
    description TEXT,
    max_tokens  INTEGER,
    content     TEXT    NOT NULL,
    PRIMARY KEY (namespace, session_id, label)
) WITHOUT ROWID;

-- A rowid table: the full-text index refers to entries by rowid.
CREATE TABLE context_entries (
    namespace   TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    label       TEXT NOT NULL,
    key         TEXT NOT NULL,
    content     TEXT NOT NULL,
    description TEXT,
    UNIQUE (namespace, session_id, label, key)
);

-- Entry text by context_entries rowid, kept in step by every entry write and delete.
CREATE VIRTUAL TABLE context_fts USING fts5(content, tokenize = 'porter unicode61');

CREATE TABLE context_prompts (
    namespace  TEXT    NOT NULL,
    session_id TEXT    NOT NULL,
    prompt     TEXT    NOT NULL,
    frozen_at  INTEGER NOT NULL,
    PRIMARY KEY (namespace, session_id)
) WITHOUT ROWID;
