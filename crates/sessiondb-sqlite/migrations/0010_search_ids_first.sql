-- sessiondb schema 10: the full-text index's table is keyed (message_id, namespace, session_id),
-- as the id index is since schema 9, so a group commit's appends to many sessions share its
-- pages. The index is derived data that the first search builds (`schema::SEARCH_TABLES`): an
-- index built with the earlier key is dropped here, and the next search builds it again.

DROP TRIGGER IF EXISTS message_search_ai;
DROP TRIGGER IF EXISTS message_search_ad;
DROP TRIGGER IF EXISTS message_search_au;
DROP TABLE IF EXISTS message_fts;
DROP TABLE IF EXISTS message_search;
DELETE FROM store_meta WHERE key = 'search_index';
