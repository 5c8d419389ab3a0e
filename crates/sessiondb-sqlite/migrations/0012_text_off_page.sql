-- sessiondb schema 12: a message whose row would not fit on its page keeps its text in
-- `message_chunks`, now a rowid table. A `messages` row (a WITHOUT ROWID table, clustered by
-- session and seq) keeps at most 1,002 bytes on its B-tree page; a longer row spilled into an
-- overflow page of its own, so a message of 1-4 KB took a whole extra 4 KiB page (a store of
-- 1.5 KB messages was 3.6 times their JSON). A rowid table keeps up to 4,061 bytes of a row on
-- its page, beside other rows. Such a message now has an empty `content` and its whole text in
-- continuation slices from 1 on (new writes cut texts up to 16 KiB into slices of 950 bytes, four to a page; a row moved
-- here is one slice); messages of 1.5 MB and more keep their first slice as before. The bound
-- is `write::placed_text`'s.

CREATE TABLE message_chunks_v12 (
    namespace  TEXT    NOT NULL,
    session_id TEXT    NOT NULL,
    id         TEXT    NOT NULL,
    idx        INTEGER NOT NULL,
    content    TEXT    NOT NULL
);

INSERT INTO message_chunks_v12 (namespace, session_id, id, idx, content)
    SELECT namespace, session_id, id, idx, content FROM message_chunks;

INSERT INTO message_chunks_v12 (namespace, session_id, id, idx, content)
    SELECT namespace, session_id, id, 1, content FROM messages
     WHERE content_chunks = 0
       AND length(CAST(content AS BLOB)) + length(CAST(namespace AS BLOB))
           + length(CAST(session_id AS BLOB)) + length(CAST(id AS BLOB))
           + coalesce(length(CAST(parent_id AS BLOB)), 0) + length(CAST(role AS BLOB)) + 100 > 1002;

UPDATE messages SET content = '', content_chunks = 1
 WHERE content_chunks = 0
   AND length(CAST(content AS BLOB)) + length(CAST(namespace AS BLOB))
       + length(CAST(session_id AS BLOB)) + length(CAST(id AS BLOB))
       + coalesce(length(CAST(parent_id AS BLOB)), 0) + length(CAST(role AS BLOB)) + 100 > 1002;

DROP TABLE message_chunks;
ALTER TABLE message_chunks_v12 RENAME TO message_chunks;
CREATE UNIQUE INDEX message_chunks_by_message ON message_chunks (namespace, session_id, id, idx);
