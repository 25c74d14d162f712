-- 002_api: the tables of the HTTP API (`webhook-worker api`), and its login's role memberships.
--
-- Tokens: only a SHA-256 hash of each token is stored, never the token, so whoever reads this table
-- (a backup, a replica) cannot call the API with what they read. A token has one role: producer
-- (publish only), reader (every read, as webhooks_reader), admin (everything).
--
-- Operations: a bulk replay of dead letters (POST /v1/dead-letters/replay) is a row here that an
-- API process advances in bounded steps, so it survives the process that started it.
--
-- Roles: the API connects as one login role and sets webhooks_producer or webhooks_reader per
-- request (SET LOCAL ROLE), so that login must be a member of both; the owner running this
-- migration is made one when it may be (docs/security.md says what to grant otherwise).
-- The functions over these tables are in functions/api.sql.

CREATE TABLE webhooks.api_tokens (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       text        NOT NULL UNIQUE
               CONSTRAINT api_token_name_printable
               CHECK (length(name) BETWEEN 1 AND 200 AND name !~ '[[:cntrl:]]'),
    role       text        NOT NULL CHECK (role IN ('producer', 'reader', 'admin')),
    -- SHA-256 of the token's UTF-8 text
    token_hash bytea       NOT NULL UNIQUE CHECK (length(token_hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    revoked_at timestamptz
);

COMMENT ON TABLE webhooks.api_tokens IS
    'HTTP API tokens: name, role and the SHA-256 of the token (never the token itself).';

CREATE TABLE webhooks.api_operations (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('replay_dead_letters')),
    -- replay_dead_letters(): webhook_id, event_type, category, since, until (absent: any)
    filter       jsonb       NOT NULL DEFAULT '{}',
    rate         double precision CHECK (rate IS NULL OR rate > 0),
    max_rows     integer     CHECK (max_rows IS NULL OR max_rows > 0),
    status       text        NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'done', 'failed')),
    processed    bigint      NOT NULL DEFAULT 0,
    requested_by text        NOT NULL,
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);

COMMENT ON TABLE webhooks.api_operations IS
    'Bulk operations started over the HTTP API, advanced in resumable steps.';

CREATE INDEX api_operations_running ON webhooks.api_operations (id) WHERE status = 'running';

-- The API's login sets these roles per request; the owner is its usual login.
DO $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        EXECUTE format('GRANT webhooks_producer, webhooks_reader TO %I', current_user);
    END IF;
EXCEPTION WHEN insufficient_privilege OR invalid_grant_operation THEN
    RAISE NOTICE 'the API''s login role needs membership of webhooks_producer and webhooks_reader: '
                 'GRANT them to it (docs/security.md)';
END;
$$;
