-- sessiondb schema 4: content-addressed attachments. A payload is stored once per namespace
-- (meta row + chunks of 1,572,864 bytes) and lives while a reference to it remains.

CREATE TABLE attachments (
    namespace  TEXT    NOT NULL,
    hash       TEXT    NOT NULL,  -- SHA-256 of the decoded bytes, lowercase hex
    media_type TEXT    NOT NULL,
    bytes      INTEGER NOT NULL,
    chunks     INTEGER NOT NULL,
    PRIMARY KEY (namespace, hash)
) WITHOUT ROWID;

-- Large rows: a rowid table keeps the blobs out of the key's B-tree.
CREATE TABLE attachment_chunks (
    namespace TEXT    NOT NULL,
    hash      TEXT    NOT NULL,
    idx       INTEGER NOT NULL,  -- 0-based
    data      BLOB    NOT NULL,
    PRIMARY KEY (namespace, hash, idx)
);

CREATE TABLE attachment_refs (
    namespace  TEXT NOT NULL,
    session_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    hash       TEXT NOT NULL,
    PRIMARY KEY (namespace, session_id, message_id, hash)
) WITHOUT ROWID;

-- "Is any reference left?" for garbage collection, anywhere in the namespace.
CREATE INDEX attachment_refs_by_hash ON attachment_refs (namespace, hash);
