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
        DEFAULT '{"delays": [5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400]}',
    retry_jitter       real        NOT NULL DEFAULT 0.2 CHECK (retry_jitter BETWEEN 0 AND 1),
    max_deferrals      integer     NOT NULL DEFAULT 20 CHECK (max_deferrals >= 0),
    timeout_ms         integer     NOT NULL DEFAULT 10000 CHECK (timeout_ms BETWEEN 100 AND 300000),
    lease_seconds      integer     NOT NULL DEFAULT 60,
    claim_batch_size   integer     NOT NULL DEFAULT 100 CHECK (claim_batch_size BETWEEN 1 AND 10000),
    finish_batch_size  integer     NOT NULL DEFAULT 100 CHECK (finish_batch_size BETWEEN 1 AND 10000),
    notify_enabled     boolean     NOT NULL DEFAULT true,
    delivered_retention interval   NOT NULL DEFAULT '7 days',
    log_retention      interval    NOT NULL DEFAULT '30 days',
    updated_at         timestamptz NOT NULL DEFAULT now(),
    -- The lease must outlast the longest request plus a margin, or a slow request would be
    -- delivered twice.
    CONSTRAINT lease_outlasts_timeout CHECK (lease_seconds * 1000 >= timeout_ms + 5000)
);

INSERT INTO webhooks.delivery_config DEFAULT VALUES;
