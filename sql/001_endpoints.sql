-- 001_endpoints: the receivers we deliver to, with their per-endpoint overrides.
--
-- URLs and signing secrets are credentials (Slack and Mattermost carry the secret in the URL path).
-- They are text columns so that a later migration can store ciphertext envelopes in them without a
-- reshape; `url_display` (scheme, host and port only) is the form that may appear in logs.

CREATE TABLE webhooks.endpoints (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name             text        NOT NULL UNIQUE CHECK (name <> ''),
    url              text        NOT NULL,
    url_display      text        NOT NULL,
    -- [{"secret": "whsec_...", "expires_at": null | timestamptz}], newest first
    signing_secrets  jsonb       NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(signing_secrets) = 'array'),
    active           boolean     NOT NULL DEFAULT true,
    disabled_reason  text,
    disabled_at      timestamptz,
    -- '{*}' subscribes to every event type
    event_types      text[]      NOT NULL DEFAULT '{*}',
    headers          jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    body_format      text        NOT NULL DEFAULT 'raw',
    -- Overrides of webhooks.delivery_config; NULL means "use the global default".
    max_attempts     integer     CHECK (max_attempts BETWEEN 1 AND 100),
    retry_schedule   jsonb,
    timeout_ms       integer     CHECK (timeout_ms BETWEEN 100 AND 300000),
    rate_limit_per_second numeric CHECK (rate_limit_per_second > 0),
    rate_limit_burst integer     CHECK (rate_limit_burst >= 1),
    max_in_flight    integer     CHECK (max_in_flight >= 1),
    delivery_ttl     interval,
    metadata         jsonb       NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
