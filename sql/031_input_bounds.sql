-- 031_input_bounds: what producers and workers pass in is bounded, and the worker's own event types
-- are the worker's alone (issue 16, items 1, 2 and 6).
--
-- Reserved event types. Types starting with 'webhook.' are the operational events the schema owner's
-- functions publish (006, 022). publish() already refused them; a plain INSERT or enqueue() did not.
-- Now the insert trigger refuses them unless the inserting role has the queue owner's privileges
-- (the owner, a role inheriting them, a superuser): the operational events are inserted by the
-- owner's SECURITY DEFINER functions, so they pass, and so does the operator's
-- `webhook-worker enqueue` (default type webhook.test). enqueue() becomes SECURITY INVOKER so that
-- the trigger sees who calls it: a producer holds every privilege its INSERT ... ON CONFLICT needs
-- (022), and the insert trigger that reads the settings stays DEFINER. Running as the caller also
-- keeps whatever row-level rules later apply to the caller.
--
-- traceparent. A value that is not a W3C trace context (55 characters, lowercase hex:
-- 00-<32>-<16>-<2>, ids not all zeros, version not ff) could only fail every attempt (a CR or LF is
-- a header injection the HTTP client refuses). Refused at insert by the constraint
-- traceparent_w3c_format. Queued rows that hold one become dead letters here, with the reason, as
-- 023 did for identifiers; finished rows are exempt so history stays as it was, and the constraint
-- is added NOT VALID (no rescan under the migration's lock; every row satisfies it once the update
-- below has run, so VALIDATE CONSTRAINT would pass). Replaying such a dead letter fails with the
-- constraint's name until its traceparent is set right or to NULL.
--
-- Sizes. metadata (as JSON text) at most 64 KiB and source_ref at most 4 KiB, refused at insert
-- like the payload (020: SQLSTATE 54000, the field and the limit named). Checked in the insert
-- trigger rather than by a constraint, so rows queued before keep moving: a constraint is checked on
-- every status update too, and an old oversized row would make every claim that touched it fail.
--
-- Caller-controlled arguments. acquire(): p_batch_size 1..10000 (delivery_config's own bound) and
-- p_lease_seconds 1..3600; ensure_log_partitions(): days_ahead 0..31. Out of range is refused with
-- SQLSTATE 22023 naming the argument and its bounds. delivery_config.lease_seconds gets the same
-- upper bound (a value above it is lowered to it here, as no claim could use it any more).
--
-- Functions restated whole from their latest definitions (acquire 029, enqueue 009,
-- ensure_log_partitions 004, fill_idempotency_key 020), with the SECURITY DEFINER and SET clauses
-- 022 gave them, except enqueue's SECURITY DEFINER (above).

-- traceparent ---------------------------------------------------------------------------------------

WITH bad AS (
    UPDATE webhooks.alert_delivery_queue
    SET status = 'dead_letter', dead_letter_reason = 'traceparent is not a W3C trace context',
        failure_category = 'internal', dead_lettered_at = now(), updated_at = now(),
        locked_by = NULL, lease_token = NULL, locked_until = NULL
    WHERE status IN ('pending', 'retrying', 'delivering')
      AND traceparent IS NOT NULL
      AND NOT (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
               AND left(traceparent, 2) <> 'ff'
               AND substr(traceparent, 4, 32) <> repeat('0', 32)
               AND substr(traceparent, 37, 16) <> repeat('0', 16))
    RETURNING delivery_id, webhook_id, attempts
)
INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome, failure_category, error)
SELECT delivery_id, webhook_id, attempts, 'dead_letter', 'internal', 'traceparent is not a W3C trace context'
FROM bad;

ALTER TABLE webhooks.alert_delivery_queue
    ADD CONSTRAINT traceparent_w3c_format
        CHECK (status IN ('delivered', 'dead_letter') OR traceparent IS NULL
               OR (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                   AND left(traceparent, 2) <> 'ff'
                   AND substr(traceparent, 4, 32) <> repeat('0', 32)
                   AND substr(traceparent, 37, 16) <> repeat('0', 16))) NOT VALID;

-- reserved event types ------------------------------------------------------------------------------

-- SECURITY INVOKER on purpose: current_user must be the role that inserts (inside the owner's
-- SECURITY DEFINER functions, that is the owner). USAGE: holding the owner's privileges now (the
-- owner, a role inheriting them, a superuser), not merely a membership it has not SET.
CREATE FUNCTION webhooks.refuse_reserved_event_type() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RAISE EXCEPTION 'event type % is reserved: types starting with ''webhook.'' are the worker''s own '
                        'operational events', NEW.event_type
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;

-- The WHEN clause keeps the cost off every ordinary insert.
CREATE TRIGGER refuse_reserved_event_type
    BEFORE INSERT ON webhooks.alert_delivery_queue
    FOR EACH ROW WHEN (starts_with(NEW.event_type, 'webhook.'))
    EXECUTE FUNCTION webhooks.refuse_reserved_event_type();

CREATE OR REPLACE FUNCTION webhooks.enqueue(
    p_webhook_id      bigint,
    p_event_type      text,
    p_payload         jsonb,
    p_idempotency_key text        DEFAULT NULL,
    p_event_id        text        DEFAULT NULL,
    p_priority        integer     DEFAULT 0,
    p_source_ref      text        DEFAULT NULL,
    p_metadata        jsonb       DEFAULT '{}',
    p_ordering_key    text        DEFAULT NULL,
    p_max_attempts    integer     DEFAULT NULL,
    p_deliver_at      timestamptz DEFAULT NULL,
    p_traceparent     text        DEFAULT NULL,
    p_expires_at      timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
-- SECURITY INVOKER (031): the insert trigger must see the caller. The search_path stays fixed.
SET search_path = pg_catalog, webhooks, pg_temp
-- Short OLTP statements: JIT compilation would cost far more than it saves.
SET jit = off
AS $$
DECLARE
    v_event_id text := coalesce(p_event_id, 'evt_' || replace(gen_random_uuid()::text, '-', ''));
    v_key      text := coalesce(p_idempotency_key, v_event_id);
    v_id       bigint;
BEGIN
    INSERT INTO webhooks.alert_delivery_queue
        (webhook_id, event_id, idempotency_key, event_type, payload, priority, source_ref,
         metadata, ordering_key, max_attempts, next_retry_at, traceparent, expires_at)
    VALUES
        (p_webhook_id, v_event_id, v_key, p_event_type, p_payload, p_priority, p_source_ref,
         coalesce(p_metadata, '{}'), p_ordering_key, p_max_attempts,
         coalesce(p_deliver_at, now()), p_traceparent, p_expires_at)
    ON CONFLICT (webhook_id, idempotency_key) DO NOTHING
    RETURNING delivery_id INTO v_id;

    IF v_id IS NULL THEN
        SELECT q.delivery_id INTO v_id
        FROM webhooks.alert_delivery_queue q
        WHERE q.webhook_id = p_webhook_id AND q.idempotency_key = v_key;
    END IF;
    RETURN v_id;
END;
$$;

-- sizes ---------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION webhooks.fill_idempotency_key() RETURNS trigger
LANGUAGE plpgsql
-- Runs for producers that may not read endpoints or the config (see 022_roles).
SECURITY DEFINER SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_limit integer;
    v_size  integer;
BEGIN
    SELECT c.max_payload_bytes INTO v_limit FROM webhooks.delivery_config c;
    -- The text form is what is sent; the stored (binary, maybe compressed) size is no bound on it.
    v_size := octet_length(NEW.payload::text);
    IF v_size > v_limit THEN
        RAISE EXCEPTION 'webhook payload is % bytes; the limit is % bytes', v_size, v_limit
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Send a smaller payload (for example an id the receiver looks up), or raise '
                         'webhooks.delivery_config.max_payload_bytes.';
    END IF;
    -- Fixed limits (031): neither is sent to the receiver, and neither needs to be large.
    v_size := octet_length(NEW.metadata::text);
    IF v_size > 65536 THEN
        RAISE EXCEPTION 'webhook metadata is % bytes; the limit is 65536 bytes', v_size
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    v_size := octet_length(NEW.source_ref);
    IF v_size > 4096 THEN
        RAISE EXCEPTION 'webhook source_ref is % bytes; the limit is 4096 bytes', v_size
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF NEW.idempotency_key IS NULL THEN
        NEW.idempotency_key := NEW.event_id;
    END IF;
    IF NEW.expires_at IS NULL THEN
        -- the endpoint's default time to live, if it has one
        SELECT now() + e.delivery_ttl INTO NEW.expires_at FROM webhooks.endpoints e WHERE e.id = NEW.webhook_id;
    END IF;
    RETURN NEW;
END;
$$;

-- caller-controlled arguments -----------------------------------------------------------------------

UPDATE webhooks.delivery_config SET lease_seconds = 3600, updated_at = now() WHERE lease_seconds > 3600;
ALTER TABLE webhooks.delivery_config
    ADD CONSTRAINT lease_seconds_bounded CHECK (lease_seconds BETWEEN 1 AND 3600);

CREATE OR REPLACE FUNCTION webhooks.ensure_log_partitions(days_ahead integer DEFAULT 7) RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    day date;
    part text;
    created integer := 0;
BEGIN
    -- Bound (031): each partition is a table; a month ahead is more than any caller needs.
    IF days_ahead IS NULL OR days_ahead NOT BETWEEN 0 AND 31 THEN
        RAISE EXCEPTION 'ensure_log_partitions: days_ahead must be between 0 and 31, not %', days_ahead
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtext('webhooks.ensure_log_partitions')) THEN
        RETURN 0;
    END IF;
    FOR day IN
        SELECT d::date FROM generate_series(current_date, current_date + days_ahead, '1 day') d
    LOOP
        part := 'alert_delivery_log_' || to_char(day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass('webhooks.' || part) IS NOT NULL;
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM webhooks.alert_delivery_log_default
            WHERE logged_at >= day AND logged_at < day + 1);
        BEGIN
            EXECUTE format(
                'CREATE TABLE webhooks.%I PARTITION OF webhooks.alert_delivery_log '
                'FOR VALUES FROM (%L) TO (%L)', part, day::timestamptz, (day + 1)::timestamptz);
            created := created + 1;
        EXCEPTION WHEN duplicate_table OR check_violation THEN
            NULL;  -- another worker made it first, or rows arrived in the default partition
        END;
    END LOOP;
    RETURN created;
END;
$$;

CREATE OR REPLACE FUNCTION webhooks.acquire(p_worker_id text, p_batch_size integer, p_lease_seconds integer)
RETURNS TABLE (
    delivery_id      bigint,
    webhook_id       bigint,
    event_id         text,
    idempotency_key  text,
    event_type       text,
    payload          text,
    attempt          integer,
    max_attempts     integer,
    deferrals        integer,
    replays          integer,
    lease_token      uuid,
    locked_until     timestamptz,
    traceparent      text,
    endpoint_url     text,
    signing_secrets  jsonb,
    headers          jsonb,
    body_format      text,
    secret_settings  jsonb,
    timeout_ms       integer,     -- the endpoint's own timeout; NULL means the worker's default
    retry_schedule   jsonb,
    retry_jitter     real,
    created_at       timestamptz,
    retry_policy     jsonb        -- delivery_config.retry_policy with the endpoint's keys on top
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
-- Planned once per session, not on every call: the custom plans PostgreSQL chose otherwise cost
-- 1.7-2 ms of planning per claim, four times the claim itself when one row is due. Every
-- statement here reaches rows through an index whatever the estimates (see `claimed`); the two
-- clean-ups it calls keep their own plan choice (below).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_endpoints bigint[];
BEGIN
    -- Bounds (031): a lease beyond an hour keeps a crashed worker's rows for that long, and a claim
    -- of more rows than any worker can hold only locks them.
    IF p_batch_size IS NULL OR p_batch_size NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'acquire: p_batch_size must be between 1 and 10000, not %', p_batch_size
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_lease_seconds IS NULL OR p_lease_seconds NOT BETWEEN 1 AND 3600 THEN
        RAISE EXCEPTION 'acquire: p_lease_seconds must be between 1 and 3600, not %', p_lease_seconds
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM webhooks.reap_expired_leases();
    PERFORM webhooks.expire_deliveries();

    SELECT array_agg(x.webhook_id ORDER BY x.webhook_id) INTO v_endpoints
    FROM (
        SELECT h.webhook_id
        FROM webhooks.webhook_health_metrics h
        JOIN webhooks.endpoints e ON e.id = h.webhook_id
        WHERE e.active
          AND (h.paused_until IS NULL OR h.paused_until <= now())
          AND h.circuit_state <> 'forced_open'
          AND (h.circuit_state <> 'open' OR h.circuit_open_until <= now())
          AND EXISTS (SELECT 1 FROM webhooks.alert_delivery_queue q
                      WHERE q.webhook_id = h.webhook_id AND q.status IN ('pending', 'retrying')
                        AND q.next_retry_at <= now())
        -- least recently served first, and a bounded number: a claim never locks every endpoint
        ORDER BY h.last_claimed_at NULLS FIRST, h.webhook_id
        LIMIT p_batch_size
        FOR UPDATE OF h SKIP LOCKED
    ) x;
    IF v_endpoints IS NULL THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH cfg AS (
        SELECT * FROM webhooks.delivery_config
    ), clock AS (
        SELECT clock_timestamp() AS now_exact
    ), limits AS (
        SELECT h.webhook_id, h.circuit_state,
               h.probe_successes + h.probe_failures AS probe_results,
               coalesce(e.max_in_flight, cfg.max_in_flight) AS max_in_flight,
               coalesce(e.rate_limit_per_second, cfg.rate_limit_per_second) AS rate,
               coalesce(e.rate_limit_burst, cfg.rate_limit_burst,
                        greatest(1, ceil(coalesce(e.rate_limit_per_second, cfg.rate_limit_per_second))))
                   AS burst,
               coalesce((e.circuit_policy ->> 'probes')::integer, cfg.circuit_probes) AS probes,
               h.rate_tokens, h.rate_refilled_at
        FROM webhooks.webhook_health_metrics h
        JOIN webhooks.endpoints e ON e.id = h.webhook_id
        CROSS JOIN cfg
        WHERE h.webhook_id = ANY(v_endpoints)
    ), tokens AS (
        SELECT l.*,
               CASE WHEN l.rate IS NOT NULL THEN least(l.burst::double precision,
                   coalesce(l.rate_tokens, l.burst) + l.rate::double precision * greatest(0,
                       extract(epoch FROM clock.now_exact - coalesce(l.rate_refilled_at, clock.now_exact))))
               END AS tokens_now
        FROM limits l CROSS JOIN clock
    ), in_flight AS (
        -- a join, not a scalar subquery in the select list: `quota` reads `flying` twice (the
        -- concurrency cap, the half-open probe budget), and each read of an inlined subquery ran
        -- the count again
        SELECT t.*, f.flying
        FROM tokens t
        CROSS JOIN LATERAL (
            SELECT count(*)::integer AS flying FROM webhooks.alert_delivery_queue d
            WHERE d.webhook_id = t.webhook_id AND d.status = 'delivering' AND d.locked_until > now()
        ) f
    ), quota AS (
        SELECT t.*,
               least(
                   p_batch_size,
                   t.max_in_flight - t.flying,
                   CASE WHEN t.rate IS NULL THEN p_batch_size ELSE floor(t.tokens_now)::integer END,
                   -- Half-open: probes not yet answered are the rows in flight, so a probe lost to
                   -- a crash or a release frees its place again instead of wedging the circuit.
                   CASE t.circuit_state WHEN 'open' THEN t.probes
                                        WHEN 'half_open' THEN t.probes - t.probe_results - t.flying
                                        ELSE p_batch_size END
               ) AS quota
        FROM in_flight t
    ), candidates AS (
        SELECT qt.webhook_id, r.delivery_id, r.priority, r.next_retry_at,
               row_number() OVER (PARTITION BY qt.webhook_id
                                  ORDER BY r.priority DESC, r.next_retry_at, r.delivery_id) AS turn
        FROM quota qt
        CROSS JOIN LATERAL (
            SELECT q.delivery_id, q.priority, q.next_retry_at
            FROM webhooks.alert_delivery_queue q
            WHERE q.webhook_id = qt.webhook_id AND q.status IN ('pending', 'retrying')
              AND q.next_retry_at <= now()
              -- webhooks.is_head_of_key(), written out: a SQL function with a subquery is never
              -- inlined, and calling it for every row cost more than the rest of the claim's scan.
              AND (q.ordering_key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM webhooks.alert_delivery_queue o
                  WHERE o.webhook_id = q.webhook_id AND o.ordering_key = q.ordering_key
                    AND o.delivery_id < q.delivery_id
                    AND o.status IN ('pending', 'retrying', 'delivering')))
            ORDER BY q.priority DESC, q.next_retry_at, q.delivery_id
            LIMIT qt.quota
        ) r
        WHERE qt.quota > 0
    ), picked AS (
        SELECT c.delivery_id
        FROM candidates c
        ORDER BY c.priority DESC, c.turn, c.next_retry_at, c.delivery_id
        LIMIT p_batch_size
    ), claimed AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = 'delivering',
            attempts = q.attempts + 1,
            locked_by = p_worker_id,
            lease_token = gen_random_uuid(),
            locked_until = now() + make_interval(secs => p_lease_seconds),
            updated_at = now()
        -- by primary key whatever the row estimates: joined to `picked`, a plan made without the
        -- batch size (a generic plan) hashed the picked rows and scanned the whole queue
        WHERE q.delivery_id = ANY (ARRAY(SELECT p.delivery_id FROM picked p))
          AND q.status IN ('pending', 'retrying')
        RETURNING q.*
    ), debited AS (
        UPDATE webhooks.webhook_health_metrics h
        SET rate_tokens = CASE WHEN qt.rate IS NOT NULL THEN qt.tokens_now - n.claimed END,
            rate_refilled_at = CASE WHEN qt.rate IS NOT NULL THEN clock.now_exact END,
            circuit_state = CASE WHEN h.circuit_state = 'open' THEN 'half_open' ELSE h.circuit_state END,
            probe_successes = CASE WHEN h.circuit_state = 'open' THEN 0 ELSE h.probe_successes END,
            probe_failures = CASE WHEN h.circuit_state = 'open' THEN 0 ELSE h.probe_failures END,
            updated_at = now()
        FROM (SELECT c.webhook_id, count(*)::integer AS claimed FROM claimed c GROUP BY c.webhook_id) n
        JOIN quota qt ON qt.webhook_id = n.webhook_id
        CROSS JOIN clock
        WHERE h.webhook_id = n.webhook_id
        RETURNING h.webhook_id, h.circuit_state
    ), half_opened AS (
        INSERT INTO webhooks.endpoint_events (webhook_id, change, reason, decided_by)
        SELECT d.webhook_id, 'circuit_half_open', 'sleep over; sending probes', 'circuit breaker'
        FROM debited d JOIN quota qt ON qt.webhook_id = d.webhook_id
        WHERE qt.circuit_state = 'open'
        RETURNING 1
    )
    SELECT q.delivery_id, q.webhook_id, q.event_id, q.idempotency_key, q.event_type,
           q.payload::text, q.attempts,
           coalesce(q.max_attempts, e.max_attempts, cfg.max_attempts),
           q.deferrals, q.replays, q.lease_token, q.locked_until, q.traceparent,
           e.url, e.signing_secrets, e.headers, e.body_format, e.secret_settings, e.timeout_ms,
           coalesce(e.retry_schedule, cfg.retry_schedule), cfg.retry_jitter, q.created_at,
           cfg.retry_policy || e.retry_policy
    FROM claimed q
    JOIN webhooks.endpoints e ON e.id = q.webhook_id
    CROSS JOIN cfg
    ORDER BY q.priority DESC, q.delivery_id;

    -- Every endpoint looked at goes to the back of the line, whether it got rows or was at its
    -- cap: otherwise endpoints that can take nothing would keep the front and crowd out the rest.
    UPDATE webhooks.webhook_health_metrics SET last_claimed_at = clock_timestamp()
    WHERE webhook_id = ANY(v_endpoints);
END;
$$;
