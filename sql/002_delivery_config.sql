-- 002_delivery_config: the fleet-wide delivery defaults, one row that every worker reads.
--
-- Policy that must agree across the fleet (attempts, schedule) lives here rather than in each
-- worker's YAML, so changing it is one UPDATE and no rollout.

CREATE TABLE webhooks.delivery_config (
    singleton          boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    max_attempts       integer     NOT NULL DEFAULT 10 CHECK (max_attempts BETWEEN 1 AND 100),
    -- {"delays": [seconds, ...]} or {"base": s, "multiplier": m, "cap": s}; the default is the
    -- Standard Webhooks example: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h.
    retry_schedule     jsonb       NOT NULL
        DEFAULT '{"delays": [5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400]}'
        CHECK (webhooks.valid_retry_schedule(retry_schedule)),
    retry_jitter       real        NOT NULL DEFAULT 0.2 CHECK (retry_jitter BETWEEN 0 AND 1),
    max_deferrals      integer     NOT NULL DEFAULT 20 CHECK (max_deferrals >= 0),
    timeout_ms         integer     NOT NULL DEFAULT 10000 CHECK (timeout_ms BETWEEN 100 AND 300000),
    lease_seconds      integer     NOT NULL DEFAULT 60,
    claim_batch_size   integer     NOT NULL DEFAULT 100 CHECK (claim_batch_size BETWEEN 1 AND 10000),
    finish_batch_size  integer     NOT NULL DEFAULT 100 CHECK (finish_batch_size BETWEEN 1 AND 10000),
    notify_enabled     boolean     NOT NULL DEFAULT true,
    -- Protecting receivers, fleet-wide; each can be overridden per endpoint.
    rate_limit_per_second numeric  CHECK (rate_limit_per_second > 0),        -- NULL: unlimited
    rate_limit_burst   integer     CHECK (rate_limit_burst >= 1),            -- NULL: one second's worth
    max_in_flight      integer     NOT NULL DEFAULT 10 CHECK (max_in_flight >= 1),
    circuit_failure_ratio real     NOT NULL DEFAULT 0.6 CHECK (circuit_failure_ratio > 0 AND circuit_failure_ratio <= 1),
    circuit_window_seconds integer NOT NULL DEFAULT 60 CHECK (circuit_window_seconds >= 1),
    circuit_min_attempts integer   NOT NULL DEFAULT 20 CHECK (circuit_min_attempts >= 1),
    circuit_sleep_seconds integer  NOT NULL DEFAULT 30 CHECK (circuit_sleep_seconds >= 1),
    circuit_max_sleep_seconds integer NOT NULL DEFAULT 600 CHECK (circuit_max_sleep_seconds >= 1),
    circuit_probes     integer     NOT NULL DEFAULT 5 CHECK (circuit_probes >= 1),
    circuit_probe_success_ratio real NOT NULL DEFAULT 0.6
        CHECK (circuit_probe_success_ratio > 0 AND circuit_probe_success_ratio <= 1),
    -- An endpoint with no success for this long is disabled.
    disable_after      interval    NOT NULL DEFAULT '5 days',
    -- Finer retry control (each key can be overridden per endpoint, see endpoints.retry_policy):
    -- {"connect_timeout_ms": n, "timeout_growth": f, "timeout_cap_ms": n,
    --  "category_min_delays": {"rate_limited": 60, "dns": 5, ...}}
    retry_policy       jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(retry_policy) = 'object'),
    -- An operational event (webhook.endpoint.dead_letters) each time an endpoint gathers this many
    -- new dead letters.
    dead_letter_alert_threshold integer NOT NULL DEFAULT 100 CHECK (dead_letter_alert_threshold >= 1),
    delivered_retention interval   NOT NULL DEFAULT '7 days',
    log_retention      interval    NOT NULL DEFAULT '30 days',
    updated_at         timestamptz NOT NULL DEFAULT now(),
    -- The lease must outlast the longest request plus a margin, or a slow request would be
    -- delivered twice.
    CONSTRAINT lease_outlasts_timeout CHECK (lease_seconds * 1000 >= timeout_ms + 5000)
);

INSERT INTO webhooks.delivery_config DEFAULT VALUES;
