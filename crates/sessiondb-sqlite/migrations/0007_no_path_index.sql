-- sessiondb schema 7: path walks read the messages table itself. The covering `messages_path`
-- index let them skip content pages, but every append paid for it with one more B-tree page per
-- commit (a whole WAL frame); walks and branch reads measured no slower without it.

DROP INDEX messages_path;
