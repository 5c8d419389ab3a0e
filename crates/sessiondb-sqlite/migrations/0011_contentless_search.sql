-- sessiondb schema 11: the full-text index keeps no copy of the texts it holds. `message_fts`
-- becomes a contentless FTS5 table (`contentless_delete`), and `message_search` keeps a row's
-- text only until the index holds it; search results read their text from the message itself.
-- The index is derived data that the first search builds (`schema::SEARCH_TABLES`): one built
-- in the earlier shape is dropped here, and the next search builds it again.

DROP TRIGGER IF EXISTS message_search_ad;
DROP TABLE IF EXISTS message_fts;
DROP TABLE IF EXISTS message_search;
DELETE FROM store_meta WHERE key IN ('search_index', 'search_indexed');
