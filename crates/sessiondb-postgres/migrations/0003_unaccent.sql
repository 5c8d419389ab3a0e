-- sessiondb PostgreSQL schema 3: search folds diacritics, as the embedded store's FTS5
-- tokenizer (unicode61) does, so "cafe" finds "café" (and "café" finds "cafe") on both
-- backends. `unaccent` (contrib; a trusted extension since PostgreSQL 13, so the database's
-- owner may create it) filters each word before stemming, in documents and queries alike.
CREATE EXTENSION IF NOT EXISTS unaccent;
ALTER TEXT SEARCH CONFIGURATION sessiondb_search
    ALTER MAPPING FOR word, hword, hword_part WITH unaccent, sessiondb_stem;

-- Stored vectors were computed without it. An update recomputes a row's generated vector; only
-- rows with non-ASCII text can change (ASCII words have nothing to fold).
UPDATE messages SET search_text = search_text WHERE search_text ~ '[^\x01-\x7F]';
UPDATE context_entries SET content = content WHERE content ~ '[^\x01-\x7F]';
