-- sessiondb schema 14: every session carries a version that moves with each change of its row
-- (`SessionRow::next_version`), so a reader can tell that a session is as it last read it.
-- Sessions stored before start at 0; their next write moves them past it.
ALTER TABLE sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
