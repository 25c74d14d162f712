-- 003_console_sessions: server-side sessions of the operator console (/console/).
--
-- The cookie carries only a random session id; this table keeps the id's SHA-256 and the SHA-256
-- of the token it was opened with, never either secret. Sessions end with their token, after an
-- absolute lifetime (expires_at), and on logout (functions/console.sql).
--
-- The overview's chart counts the audit log's attempts of the last hours; a BRIN index on
-- logged_at (tiny, as the log is appended in time order) lets that read only those hours' pages
-- instead of every row of the day's partitions.

CREATE TABLE webhooks.console_sessions (
    session_hash bytea       PRIMARY KEY CHECK (length(session_hash) = 32),
    token_hash   bytea       NOT NULL CHECK (length(token_hash) = 32),
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL
);

COMMENT ON TABLE webhooks.console_sessions IS
    'Console sessions: SHA-256 of the session id and of the token it stands for, never either.';

CREATE INDEX console_sessions_token ON webhooks.console_sessions (token_hash);

CREATE INDEX alert_delivery_log_logged_at ON webhooks.alert_delivery_log USING brin (logged_at);
