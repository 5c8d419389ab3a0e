-- sessiondb schema 15: the highest version a deleted session of each namespace had. A session
-- created afterwards starts above it (`SessionRow::absent`), so a session deleted and created
-- again never repeats a version its earlier self had, even within one millisecond or after the
-- clock stepped back.
CREATE TABLE deleted_versions (
    namespace TEXT    NOT NULL PRIMARY KEY,
    version   INTEGER NOT NULL
) WITHOUT ROWID;
