-- sessiondb schema 3: one user's sessions are listed from indexes led by the user, in each sort
-- order, so a listing reads only that user's entries (never the namespace's).

DROP INDEX sessions_by_user;
CREATE INDEX sessions_by_user_updated ON sessions (namespace, user_id, updated_at, id)
    WHERE user_id IS NOT NULL;
CREATE INDEX sessions_by_user_created ON sessions (namespace, user_id, created_at, id)
    WHERE user_id IS NOT NULL;
CREATE INDEX sessions_by_user_last_message
    ON sessions (namespace, user_id, coalesce(last_message_at, created_at), id)
    WHERE user_id IS NOT NULL;
