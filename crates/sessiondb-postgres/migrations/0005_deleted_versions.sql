-- sessiondb PostgreSQL schema 5: the highest version a deleted session of each namespace had. A
-- session created afterwards starts above it (`SessionRow::absent`), so a session deleted and
-- created again never repeats a version its earlier self had, even when the instance that
-- creates it has a clock behind the one that deleted it.
CREATE TABLE deleted_versions (
    namespace TEXT   NOT NULL PRIMARY KEY,
    version   BIGINT NOT NULL
);
