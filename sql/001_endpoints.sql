-- 001_endpoints: the receivers we deliver to, with their per-endpoint overrides.
--
-- URLs and signing secrets are credentials (Slack and Mattermost carry the secret in the URL path).
-- They are text columns so that a later migration can store ciphertext envelopes in them without a
-- reshape; `url_display` (scheme, host and port only) is the form that may appear in logs.

-- A retry schedule is {"delays": [seconds, ...]} (1 to 100 delays, each 0 to 7 days) or
-- {"base": s, "multiplier": m, "cap": s}; anything else is refused when stored, not when used.
CREATE FUNCTION webhooks.valid_retry_schedule(p_schedule jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_schedule IS NULL THEN true
        WHEN jsonb_typeof(p_schedule) <> 'object' THEN false
        WHEN p_schedule ? 'delays' THEN
            jsonb_typeof(p_schedule -> 'delays') = 'array'
            AND jsonb_array_length(p_schedule -> 'delays') BETWEEN 1 AND 100
            AND (SELECT bool_and(jsonb_typeof(d) = 'number' AND d::text::numeric BETWEEN 0 AND 604800)
                 FROM jsonb_array_elements(p_schedule -> 'delays') AS d)
            AND (SELECT count(*) FROM jsonb_object_keys(p_schedule)) = 1
        WHEN p_schedule ? 'base' THEN
            jsonb_typeof(p_schedule -> 'base') = 'number'
            AND (p_schedule ->> 'base')::numeric BETWEEN 0 AND 604800
            AND coalesce(jsonb_typeof(p_schedule -> 'multiplier') = 'number'
                         AND (p_schedule ->> 'multiplier')::numeric BETWEEN 1 AND 100, NOT p_schedule ? 'multiplier')
            AND coalesce(jsonb_typeof(p_schedule -> 'cap') = 'number'
                         AND (p_schedule ->> 'cap')::numeric BETWEEN 0 AND 604800, NOT p_schedule ? 'cap')
            AND NOT EXISTS (SELECT 1 FROM jsonb_object_keys(p_schedule) k
                            WHERE k NOT IN ('base', 'multiplier', 'cap'))
        ELSE false
    END;
$$;

CREATE TABLE webhooks.endpoints (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name             text        NOT NULL UNIQUE CHECK (name <> ''),
    url              text        NOT NULL CHECK (char_length(url) <= 8192),
    url_display      text        NOT NULL,
    -- [{"secret": "whsec_...", "expires_at": null | timestamptz}], newest first
    signing_secrets  jsonb       NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(signing_secrets) = 'array'),
    active           boolean     NOT NULL DEFAULT true,
    disabled_reason  text,
    disabled_at      timestamptz,
    -- '{*}' subscribes to every event type
    event_types      text[]      NOT NULL DEFAULT '{*}',
    headers          jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    body_format      text        NOT NULL DEFAULT 'raw'
        CHECK (body_format IN ('raw', 'envelope', 'slack', 'mattermost', 'pagerduty')),
    -- Credentials a format needs besides the URL, e.g. {"routing_key": "..."} for PagerDuty.
    secret_settings  jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(secret_settings) = 'object'),
    -- Overrides of webhooks.delivery_config; NULL means "use the global default".
    max_attempts     integer     CHECK (max_attempts BETWEEN 1 AND 100),
    retry_schedule   jsonb       CHECK (webhooks.valid_retry_schedule(retry_schedule)),
    timeout_ms       integer     CHECK (timeout_ms BETWEEN 100 AND 300000),
    rate_limit_per_second numeric CHECK (rate_limit_per_second > 0),
    rate_limit_burst integer     CHECK (rate_limit_burst >= 1),
    max_in_flight    integer     CHECK (max_in_flight >= 1),
    -- Overrides of the circuit_* settings of delivery_config, by the same names without the prefix:
    -- {"failure_ratio", "window_seconds", "min_attempts", "sleep_seconds", "max_sleep_seconds",
    --  "probes", "probe_success_ratio"}
    circuit_policy   jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(circuit_policy) = 'object'),
    -- Deliveries not delivered within this long of being queued become dead letters ('expired').
    delivery_ttl     interval,
    retry_policy     jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(retry_policy) = 'object'),
    metadata         jsonb       NOT NULL DEFAULT '{}',
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now()
);
