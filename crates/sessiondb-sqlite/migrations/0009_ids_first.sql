-- sessiondb schema 9: the id index leads with the message id. Keyed (namespace, session_id, id),
-- each session's newest ids sat on a leaf page of their own, so a group commit of appends to N
-- sessions wrote N id-index pages to the WAL. Generated ids are time-ordered (UUID v7), so keyed
-- (id, namespace, session_id) the appends of a whole group land on the same rightmost page.
-- Every look-up names all three columns, so it still finds its row with one seek.

DROP INDEX messages_by_id;
CREATE UNIQUE INDEX messages_by_id ON messages (id, namespace, session_id);
