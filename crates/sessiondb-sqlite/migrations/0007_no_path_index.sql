-- sessiondb schema 7: path walks read the messages table itself. The covering `messages_path`
-- index let them skip content pages, but every append paid for it with one more B-tree page per
-- commit (a whole WAL frame). Branch reads measured within noise without it; a cold read that
-- walks a whole 10,000-row path costs ~10% more.

DROP INDEX messages_path;
