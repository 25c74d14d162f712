-- 001_baseline: the schema's tables, types and roles as they stand, built in one step.
--
-- What is here runs once per database: tables with their columns, constraints, indexes and storage
-- settings, the composite type finish() reads its outcomes into, the singleton rows, and the group
-- roles. Functions, views, triggers and grants are in sql/functions/ (applied after the migrations,
-- whenever they change); see sql/README.md. The one exception is valid_retry_schedule(), below: two
-- CHECK constraints call it, so it is part of the tables' definition and changes only by a migration
-- (a changed check has to be validated against the rows already stored).
--
-- A database migrated by the numbered files of the layout before this one (001_endpoints …
-- 035_worker_liveness) already has all of this: `webhook-worker migrate` recognises it and records
-- this baseline without running it (worker/schema.py).

-- Roles --------------------------------------------------------------------------------------------
-- Three group roles (NOLOGIN); give each login role the one it needs (their privileges: roles.sql):
--
--   CREATE ROLE worker_pod LOGIN PASSWORD '…' IN ROLE webhooks_worker;   -- webhook-worker processes
--   CREATE ROLE billing_app LOGIN PASSWORD '…' IN ROLE webhooks_producer; -- applications that enqueue
--   CREATE ROLE oncall LOGIN PASSWORD '…' IN ROLE webhooks_reader;        -- dashboards, audits
--
-- Roles belong to the cluster, not the database: several installations in one cluster share these
-- group roles, so keep their login roles apart with CONNECT privileges on each database.
-- Creating the roles needs CREATEROLE; without it, create them beforehand (the names above) and the
-- migration only grants.

DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['webhooks_worker', 'webhooks_producer', 'webhooks_reader'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created meanwhile by a migration of another database in this cluster
            END;
        END IF;
    END LOOP;
END;
$$;

-- Endpoints ----------------------------------------------------------------------------------------
--
-- The receivers we deliver to, with their per-endpoint overrides. URLs, signing secrets, secret
-- settings and custom header values (an Authorization header is a credential) are stored sealed:
-- AES-GCM envelopes ('enc:v1:<key id>:<base64>') made by the worker side, whose key never reaches
-- PostgreSQL. `url_display` (scheme, host and port only) is the form that may appear in logs.

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
    -- Sealed (worker/encryption.py): a sealed URL is longer than the URL (base64, nonce and tag);
    -- 8192 characters of URL fit in 11200.
    url              text        NOT NULL CHECK (char_length(url) <= 11200),
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

-- Delivery settings --------------------------------------------------------------------------------
--
-- The fleet-wide delivery defaults, one row that every worker reads. Policy that must agree across
-- the fleet (attempts, schedule) lives here rather than in each worker's YAML, so changing it is one
-- UPDATE and no rollout.

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
    CONSTRAINT lease_outlasts_timeout CHECK (lease_seconds * 1000 >= timeout_ms + 5000),
    -- Payloads larger than this (measured as the JSON text the receiver gets) are refused at enqueue
    -- by a trigger, SQLSTATE 54000 (program_limit_exceeded), never truncated.
    max_payload_bytes  integer     NOT NULL DEFAULT 262144
        CHECK (max_payload_bytes BETWEEN 1024 AND 104857600),
    -- The lease is a caller-controlled argument of acquire(); an hour bounds how long a row can be held.
    CONSTRAINT lease_seconds_bounded CHECK (lease_seconds BETWEEN 1 AND 3600)
);

INSERT INTO webhooks.delivery_config DEFAULT VALUES;

-- The queue ----------------------------------------------------------------------------------------
--
-- webhooks.alert_delivery_queue, one row per (event, endpoint) delivery.
--
-- `INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload) VALUES (...)` is
-- enough to enqueue: every other column has a default, and the idempotency key defaults to the
-- event id (set by a BEFORE trigger, since a column default cannot read another column).
--
-- Hot-table care: fillfactor below 100 so status updates stay heap-only, partial indexes that cover
-- only the claimable and leased rows, and autovacuum tuned for a table whose rows churn.

CREATE TABLE webhooks.alert_delivery_queue (
    delivery_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id         bigint      NOT NULL REFERENCES webhooks.endpoints (id),
    event_id           text        NOT NULL DEFAULT 'evt_' || replace(gen_random_uuid()::text, '-', ''),
    idempotency_key    text        NOT NULL,
    event_type         text        NOT NULL CHECK (event_type <> ''),
    payload            jsonb       NOT NULL,
    source_ref         text,
    metadata           jsonb       NOT NULL DEFAULT '{}',
    status             text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'delivering', 'retrying', 'delivered', 'dead_letter')),
    priority           smallint    NOT NULL DEFAULT 0,
    ordering_key       text,
    attempts           integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    deferrals          integer     NOT NULL DEFAULT 0 CHECK (deferrals >= 0),
    replays            integer     NOT NULL DEFAULT 0 CHECK (replays >= 0),
    -- NULL: the endpoint's override, else webhooks.delivery_config.max_attempts
    max_attempts       integer     CHECK (max_attempts BETWEEN 1 AND 100),
    next_retry_at      timestamptz NOT NULL DEFAULT now(),
    locked_by          text,
    lease_token        uuid,
    locked_until       timestamptz,
    last_http_status   integer,
    last_error         text,
    failure_category   text,
    dead_letter_reason text,
    traceparent        text,
    expires_at         timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    -- When the current round of attempts began (insert or replay): the retry window of a row whose
    -- endpoint is disabled is measured from here.
    scheduled_at       timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    delivered_at       timestamptz,
    dead_lettered_at   timestamptz,
    CONSTRAINT lease_columns_together
        CHECK ((status = 'delivering') = (lease_token IS NOT NULL AND locked_until IS NOT NULL)),
    -- With lease_columns_together: a token only ever on a row in flight, so finish() can trust the
    -- token alone to say the row is still held by this claim (and reach it by primary key).
    CONSTRAINT lease_token_only_while_delivering CHECK (lease_token IS NULL OR status = 'delivering'),
    -- Identifiers sent in headers (webhook-id, the event type) carry no control characters (a CR or
    -- LF there would be a header injection) and are bounded (a header line has a limit at every
    -- receiver). Finished rows are not held to it, so history stays as it was written.
    CONSTRAINT event_type_printable
        CHECK (status IN ('delivered', 'dead_letter')
               OR (event_type !~ '[[:cntrl:]]' AND octet_length(event_type) <= 256)),
    CONSTRAINT idempotency_key_printable
        CHECK (status IN ('delivered', 'dead_letter')
               OR (idempotency_key !~ '[[:cntrl:]]' AND octet_length(idempotency_key) <= 512)),
    CONSTRAINT traceparent_w3c_format
        CHECK (status IN ('delivered', 'dead_letter') OR traceparent IS NULL
               OR (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                   AND left(traceparent, 2) <> 'ff'
                   AND substr(traceparent, 4, 32) <> repeat('0', 32)
                   AND substr(traceparent, 37, 16) <> repeat('0', 16)))
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- The key is unique per endpoint for as long as the row is kept: producers that may retry insert
-- with ON CONFLICT (webhook_id, idempotency_key) DO NOTHING.
CREATE UNIQUE INDEX alert_delivery_queue_idempotency
    ON webhooks.alert_delivery_queue (webhook_id, idempotency_key);

-- The claim walks this per endpoint, in this order; it only ever holds rows waiting to be sent.
CREATE INDEX alert_delivery_queue_claimable
    ON webhooks.alert_delivery_queue (webhook_id, priority DESC, next_retry_at, delivery_id)
    WHERE status IN ('pending', 'retrying');

-- Is anything of this endpoint due, and when is its next row due? Without this, both would scan
-- every waiting row of an endpoint whose backlog is scheduled for later.
CREATE INDEX alert_delivery_queue_due
    ON webhooks.alert_delivery_queue (webhook_id, next_retry_at)
    WHERE status IN ('pending', 'retrying');

-- Rows in flight: per-endpoint concurrency is counted here, expired leases are found here. It
-- is small by nature (at most the fleet's concurrency).
CREATE INDEX alert_delivery_queue_leased
    ON webhooks.alert_delivery_queue (webhook_id, locked_until)
    WHERE status = 'delivering';

-- Opt-in ordering: a row with an ordering key waits for earlier unfinished rows of its key.
CREATE INDEX alert_delivery_queue_ordering
    ON webhooks.alert_delivery_queue (webhook_id, ordering_key, delivery_id)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'retrying', 'delivering');

CREATE INDEX alert_delivery_queue_dead_letters
    ON webhooks.alert_delivery_queue (webhook_id, dead_lettered_at)
    WHERE status = 'dead_letter';

-- Rows that must not be sent late: found and dead-lettered by webhooks.expire_deliveries().
CREATE INDEX alert_delivery_queue_expiry
    ON webhooks.alert_delivery_queue (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('pending', 'retrying');

-- What finish() takes, one per outcome (worker/queue.py's Finished, by field name).
CREATE TYPE webhooks.attempt_outcome AS (
    delivery_id      bigint,
    lease_token      uuid,
    attempt          integer,
    outcome          text,       -- delivered | retry | deferred | dead_letter
    retry_after_s    double precision,
    http_status      integer,
    failure_category text,
    error            text,
    response_excerpt text,
    latency_ms       integer,
    reason           text,
    disable_endpoint boolean
);

-- The audit log ------------------------------------------------------------------------------------
--
-- One row per attempt and per state change. Partitioned by day so that retention drops whole
-- partitions instead of running a mass DELETE; a default partition catches anything outside the
-- partitions that webhooks.ensure_log_partitions() keeps ahead of time.

CREATE TABLE webhooks.alert_delivery_log (
    log_id           bigint      GENERATED ALWAYS AS IDENTITY,
    delivery_id      bigint      NOT NULL,
    webhook_id       bigint      NOT NULL,
    attempt          integer     NOT NULL,
    -- attempt outcomes: delivered, retry, deferred, dead_letter;
    -- state changes: lease_expired, released, replayed
    outcome          text        NOT NULL,
    failure_category text,
    http_status      integer,
    latency_ms       integer,
    error            text,
    response_excerpt text        CHECK (octet_length(response_excerpt) <= 1024),
    worker_id        text,
    lease_token      uuid,
    stale            boolean     NOT NULL DEFAULT false,
    logged_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (log_id, logged_at)
) PARTITION BY RANGE (logged_at);

CREATE TABLE webhooks.alert_delivery_log_default
    PARTITION OF webhooks.alert_delivery_log DEFAULT;

CREATE INDEX alert_delivery_log_delivery ON webhooks.alert_delivery_log (delivery_id, logged_at);

-- Endpoint health and state ------------------------------------------------------------------------
--
-- Written by webhooks.finish() once per endpoint per batch, always in endpoint-id order so that
-- concurrent batches never deadlock. The circuit, pause and rate columns are the fleet-wide state
-- that the claim reads and updates under this row's lock; they live here so operators see health
-- and state in one row. Every endpoint has a row from its registration on.

CREATE TABLE webhooks.webhook_health_metrics (
    webhook_id           bigint      PRIMARY KEY REFERENCES webhooks.endpoints (id) ON DELETE CASCADE,
    total_attempts       bigint      NOT NULL DEFAULT 0,
    successes            bigint      NOT NULL DEFAULT 0,
    failures             bigint      NOT NULL DEFAULT 0,
    consecutive_failures integer     NOT NULL DEFAULT 0,
    total_latency_ms     bigint      NOT NULL DEFAULT 0,
    avg_latency_ms       double precision GENERATED ALWAYS AS
        (CASE WHEN total_attempts > 0 THEN total_latency_ms::double precision / total_attempts END) STORED,
    last_success_at      timestamptz,
    last_failure_at      timestamptz,
    last_http_status     integer,
    last_failure_category text,
    health_status        text        NOT NULL DEFAULT 'unknown'
        CHECK (health_status IN ('unknown', 'healthy', 'degraded', 'failing', 'disabled')),
    circuit_state        text        NOT NULL DEFAULT 'closed'
        CHECK (circuit_state IN ('closed', 'open', 'half_open', 'forced_open', 'forced_closed')),
    circuit_opened_at    timestamptz,
    circuit_open_until   timestamptz,
    circuit_sleep_seconds integer,
    -- half-open: the outcomes of probes so far (probes not yet answered are the rows in flight)
    probe_successes      integer     NOT NULL DEFAULT 0,
    probe_failures       integer     NOT NULL DEFAULT 0,
    -- The circuit's sliding window, as two fixed windows weighted by overlap: cheap to keep per
    -- batch and close enough to a true sliding count.
    window_started_at    timestamptz,
    window_attempts      integer     NOT NULL DEFAULT 0,
    window_failures      integer     NOT NULL DEFAULT 0,
    previous_attempts    integer     NOT NULL DEFAULT 0,
    previous_failures    integer     NOT NULL DEFAULT 0,
    -- 429/503 with Retry-After pauses the whole endpoint, for every worker.
    paused_until         timestamptz,
    rate_tokens          double precision,
    rate_refilled_at     timestamptz,
    failing_since        timestamptz,
    dead_letters_since_notice integer NOT NULL DEFAULT 0,
    -- the claim serves the least recently served endpoints first
    last_claimed_at      timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);

-- Who or what decided each change of an endpoint's state, and why.
CREATE TABLE webhooks.endpoint_events (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id  bigint      NOT NULL REFERENCES webhooks.endpoints (id) ON DELETE CASCADE,
    -- disabled, enabled, circuit_opened, circuit_half_open, circuit_closed, circuit_reset,
    -- circuit_forced_open, circuit_forced_closed, paused
    change      text        NOT NULL,
    reason      text,
    decided_by  text        NOT NULL,
    delivery_id bigint,
    attempt     integer,
    at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX endpoint_events_by_endpoint ON webhooks.endpoint_events (webhook_id, at);

-- Statistics sampling ------------------------------------------------------------------------------
--
-- queue_stats() counts only for the first caller in each interval: this row records when the fleet
-- last sampled.

CREATE TABLE webhooks.stats_sample (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    sampled_at timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO webhooks.stats_sample DEFAULT VALUES;

-- Worker liveness ----------------------------------------------------------------------------------
--
-- One row per running worker process, which holds a session-level advisory lock on lock_key for its
-- whole life: a dead worker's rows are reclaimed as soon as its session ends (functions/liveness.sql).

CREATE TABLE webhooks.worker_liveness (
    worker_id             text        PRIMARY KEY,
    -- a random id per process: tells a reconnection of the same process from a new process
    instance              uuid        NOT NULL,
    lock_key              bigint      NOT NULL,
    backend_pid           integer     NOT NULL,
    -- the PostgreSQL lifetime the registration (and its lock) belongs to
    postmaster_started_at timestamptz NOT NULL,
    started_at            timestamptz NOT NULL DEFAULT now(),
    registered_at         timestamptz NOT NULL DEFAULT now(),
    -- first seen without its lock; cleared when the worker registers again
    lost_at               timestamptz
);

COMMENT ON TABLE webhooks.worker_liveness IS
    'One row per running worker process; its session holds an advisory lock on lock_key (035).';
