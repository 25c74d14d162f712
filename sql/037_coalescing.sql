-- 037_coalescing: alert storms go out as digests, one request for many rows (issue 23).
--
-- A storm of 500 alerts to a Slack webhook limited to one request a second trickled out over eight
-- minutes. An endpoint may now set coalesce_max (and optionally coalesce_window): when more of its
-- rows are due than its limits let through now (or its oldest due row has waited coalesce_window),
-- a claim takes up to coalesce_max due rows together and the worker sends them as one request, a
-- digest. A lone row is never held back for company. Rate tokens, max_in_flight and half-open probes
-- count requests, so a digest costs one of each. Rows with an ordering key are coalesced only with
-- rows of the same key, in the key's order: the head of the key takes the rows that follow it.
--
-- Every member keeps its own row, lease token, attempts and audit history: finish() takes one
-- outcome per member, as before, and the audit log records the digest that carried each attempt
-- (alert_delivery_log.digest_id). A digest that fails keeps its members (queue.digest_id) and is
-- claimed again as the same group, so the worker sends it with the same webhook-id; a member that
-- is dead-lettered (expired, exhausted) or finished leaves the group, and a replayed row comes back
-- on its own. Only the digest's first member counts in the endpoint's health and circuit: one
-- request, one result.
--
-- Part 1, schema: the endpoint's policy, the digest ids, the index that finds a digest's members.
-- Part 2, functions restated whole from their latest definitions (acquire 031, finish 032,
-- update_endpoint 018, replay_rows 014), with the SECURITY DEFINER and SET clauses 022 gave them.
-- acquire() returns one more column (digest_id), which CREATE OR REPLACE cannot do: it is dropped
-- and created again, with 022's grant restated and PUBLIC's default EXECUTE revoked.

-- ---- Part 1: schema -------------------------------------------------------------------------

ALTER TABLE webhooks.endpoints
    ADD COLUMN coalesce_max integer,
    ADD COLUMN coalesce_window interval,
    ADD CONSTRAINT endpoints_coalesce_max_range CHECK (coalesce_max BETWEEN 2 AND 1000),
    ADD CONSTRAINT endpoints_coalesce_window_range
        CHECK (coalesce_window >= interval '0' AND coalesce_window <= interval '1 hour'),
    ADD CONSTRAINT endpoints_coalesce_window_needs_max
        CHECK (coalesce_window IS NULL OR coalesce_max IS NOT NULL),
    -- PagerDuty groups by dedup_key itself, and a raw body has no shape to put several in
    ADD CONSTRAINT endpoints_coalesce_format
        CHECK (coalesce_max IS NULL OR body_format IN ('slack', 'mattermost', 'envelope'));

COMMENT ON COLUMN webhooks.endpoints.coalesce_max IS
    'Digest size: with more rows due than the limits let through, up to this many go as one request';
COMMENT ON COLUMN webhooks.endpoints.coalesce_window IS
    'Also coalesce once the oldest due row has waited this long (NULL: only when held by the limits)';

CREATE SEQUENCE webhooks.digest_id_seq;

-- The digest a row is in while it is claimable or in flight; cleared when the row finishes.
ALTER TABLE webhooks.alert_delivery_queue ADD COLUMN digest_id bigint;
-- The digest that carried this attempt: "delivered in digest d-17 with 36 others".
ALTER TABLE webhooks.alert_delivery_log ADD COLUMN digest_id bigint;

CREATE INDEX alert_delivery_queue_digest ON webhooks.alert_delivery_queue (digest_id)
    WHERE digest_id IS NOT NULL AND status IN ('pending', 'retrying', 'delivering');
CREATE INDEX alert_delivery_log_digest ON webhooks.alert_delivery_log (digest_id)
    WHERE digest_id IS NOT NULL;

GRANT SELECT (coalesce_max, coalesce_window) ON webhooks.endpoints TO webhooks_reader;

-- ---- Part 2: functions ----------------------------------------------------------------------

CREATE OR REPLACE FUNCTION webhooks.update_endpoint(p_webhook_id bigint, p_changes jsonb) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_unknown text;
BEGIN
    SELECT k INTO v_unknown FROM jsonb_object_keys(p_changes) k
    WHERE k NOT IN ('url', 'url_display', 'event_types', 'headers', 'max_attempts', 'timeout_ms',
                    'retry_schedule', 'rate_limit_per_second', 'rate_limit_burst', 'max_in_flight',
                    'circuit_policy', 'body_format', 'secret_settings', 'delivery_ttl', 'retry_policy',
                    'coalesce_max', 'coalesce_window')
    LIMIT 1;
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION 'update_endpoint: unknown field %', v_unknown;
    END IF;
    UPDATE webhooks.endpoints e SET
        url = CASE WHEN p_changes ? 'url' THEN p_changes ->> 'url' ELSE e.url END,
        url_display = CASE WHEN p_changes ? 'url_display' THEN p_changes ->> 'url_display' ELSE e.url_display END,
        event_types = CASE WHEN p_changes ? 'event_types'
                           THEN ARRAY(SELECT jsonb_array_elements_text(p_changes -> 'event_types'))
                           ELSE e.event_types END,
        headers = CASE WHEN p_changes ? 'headers' THEN p_changes -> 'headers' ELSE e.headers END,
        max_attempts = CASE WHEN p_changes ? 'max_attempts' THEN (p_changes ->> 'max_attempts')::integer
                            ELSE e.max_attempts END,
        timeout_ms = CASE WHEN p_changes ? 'timeout_ms' THEN (p_changes ->> 'timeout_ms')::integer
                          ELSE e.timeout_ms END,
        retry_schedule = CASE WHEN p_changes ? 'retry_schedule' THEN nullif(p_changes -> 'retry_schedule', 'null')
                              ELSE e.retry_schedule END,
        rate_limit_per_second = CASE WHEN p_changes ? 'rate_limit_per_second'
                                     THEN (p_changes ->> 'rate_limit_per_second')::numeric
                                     ELSE e.rate_limit_per_second END,
        rate_limit_burst = CASE WHEN p_changes ? 'rate_limit_burst'
                                THEN (p_changes ->> 'rate_limit_burst')::integer ELSE e.rate_limit_burst END,
        max_in_flight = CASE WHEN p_changes ? 'max_in_flight' THEN (p_changes ->> 'max_in_flight')::integer
                             ELSE e.max_in_flight END,
        circuit_policy = CASE WHEN p_changes ? 'circuit_policy' THEN p_changes -> 'circuit_policy'
                              ELSE e.circuit_policy END,
        body_format = CASE WHEN p_changes ? 'body_format' THEN p_changes ->> 'body_format' ELSE e.body_format END,
        secret_settings = CASE WHEN p_changes ? 'secret_settings' THEN p_changes -> 'secret_settings'
                               ELSE e.secret_settings END,
        delivery_ttl = CASE WHEN p_changes ? 'delivery_ttl' THEN (p_changes ->> 'delivery_ttl')::interval
                            ELSE e.delivery_ttl END,
        retry_policy = CASE WHEN p_changes ? 'retry_policy' THEN p_changes -> 'retry_policy'
                            ELSE e.retry_policy END,
        -- (037) JSON null, or the key absent, leaves coalescing off
        coalesce_max = CASE WHEN p_changes ? 'coalesce_max' THEN (p_changes ->> 'coalesce_max')::integer
                            ELSE e.coalesce_max END,
        coalesce_window = CASE WHEN p_changes ? 'coalesce_window'
                               THEN (p_changes ->> 'coalesce_window')::interval ELSE e.coalesce_window END,
        updated_at = now()
    WHERE e.id = p_webhook_id;
    RETURN FOUND;
END;
$$;

CREATE OR REPLACE FUNCTION webhooks.replay_rows(p_delivery_ids bigint[]) RETURNS integer
LANGUAGE sql
SET jit = off
AS $$
    WITH replayed AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = 'pending', attempts = 0, deferrals = 0, replays = q.replays + 1,
            next_retry_at = now(), dead_letter_reason = NULL, dead_lettered_at = NULL,
            delivered_at = NULL, scheduled_at = now(), updated_at = now(),
            -- an expired row replayed on purpose is meant to be sent now
            expires_at = CASE WHEN q.failure_category = 'expired' THEN NULL ELSE q.expires_at END,
            -- (037) a replayed row comes back on its own, never into the digest it was in
            digest_id = NULL
        WHERE q.delivery_id = ANY(p_delivery_ids) AND q.status IN ('dead_letter', 'delivered')
        RETURNING q.delivery_id, q.webhook_id, q.replays
    ), logged AS (
        INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome, error)
        SELECT delivery_id, webhook_id, 0, 'replayed', 'replay ' || replays FROM replayed
        RETURNING 1
    )
    SELECT count(*)::integer FROM logged;
$$;

DROP FUNCTION webhooks.acquire(text, integer, integer);

CREATE FUNCTION webhooks.acquire(p_worker_id text, p_batch_size integer, p_lease_seconds integer)
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
    retry_policy     jsonb,       -- delivery_config.retry_policy with the endpoint's keys on top
    digest_id        bigint       -- the digest (one request) the row goes in; NULL: a request of its own
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
               h.rate_tokens, h.rate_refilled_at,
               -- raw and pagerduty bodies are never coalesced (037; a constraint keeps them unset)
               CASE WHEN e.body_format IN ('slack', 'mattermost', 'envelope') THEN e.coalesce_max END
                   AS coalesce_max,
               e.coalesce_window
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
            -- requests, not rows: a digest in flight is one request however many rows it carries
            SELECT count(DISTINCT coalesce(d.digest_id, -d.delivery_id))::integer AS flying
            FROM webhooks.alert_delivery_queue d
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
    ), backlog AS (
        -- Coalescing (037) starts only when more rows wait than the limits let through now, or
        -- when the oldest due row has waited coalesce_window for company: a lone row goes alone.
        -- Counted up to one past the quota, so a storm costs no more to look at than a trickle.
        SELECT qt.*,
               coalesce(qt.coalesce_max IS NOT NULL AND qt.quota > 0 AND (
                   w.waiting > qt.quota
                   OR w.oldest_due <= now() - qt.coalesce_window), false) AS coalescing
        FROM quota qt
        LEFT JOIN LATERAL (
            SELECT count(*) AS waiting, min(b.next_retry_at) AS oldest_due
            FROM (SELECT q.next_retry_at FROM webhooks.alert_delivery_queue q
                  WHERE q.webhook_id = qt.webhook_id AND q.status IN ('pending', 'retrying')
                    AND q.next_retry_at <= now() AND q.digest_id IS NULL
                  ORDER BY q.next_retry_at
                  LIMIT greatest(qt.quota, 0) + 1) b
        ) w ON qt.coalesce_max IS NOT NULL
    ), candidates AS (
        SELECT qt.webhook_id, qt.quota, qt.coalescing, qt.coalesce_max,
               r.delivery_id, r.priority, r.next_retry_at, r.digest_id, r.ordering_key,
               row_number() OVER (PARTITION BY qt.webhook_id
                                  ORDER BY r.priority DESC, r.next_retry_at, r.delivery_id) AS turn
        FROM backlog qt
        CROSS JOIN LATERAL (
            SELECT q.delivery_id, q.priority, q.next_retry_at, q.digest_id, q.ordering_key
            FROM webhooks.alert_delivery_queue q
            WHERE q.webhook_id = qt.webhook_id AND q.status IN ('pending', 'retrying')
              AND q.next_retry_at <= now()
              -- a digest that failed goes again as one request: its first member stands for it
              AND (q.digest_id IS NULL OR NOT EXISTS (
                  SELECT 1 FROM webhooks.alert_delivery_queue m
                  WHERE m.digest_id = q.digest_id AND m.delivery_id < q.delivery_id
                    AND m.status IN ('pending', 'retrying')))
              -- webhooks.is_head_of_key(), written out: a SQL function with a subquery is never
              -- inlined, and calling it for every row cost more than the rest of the claim's scan.
              AND (q.ordering_key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM webhooks.alert_delivery_queue o
                  WHERE o.webhook_id = q.webhook_id AND o.ordering_key = q.ordering_key
                    AND o.delivery_id < q.delivery_id
                    AND o.status IN ('pending', 'retrying', 'delivering')))
            ORDER BY q.priority DESC, q.next_retry_at, q.delivery_id
            -- the quota counts requests: coalescing, each may carry coalesce_max rows
            LIMIT qt.quota * CASE WHEN qt.coalescing THEN qt.coalesce_max ELSE 1 END
        ) r
        WHERE qt.quota > 0
    ), grouped AS (
        -- Which request each candidate goes in: a failed digest's again, one of its own, or (the
        -- endpoint coalescing) a run of up to coalesce_max rows in claim order. Only the head of
        -- an ordering key is ever a candidate: it takes its key's next rows in `key_runs`.
        SELECT c.*,
               CASE WHEN c.digest_id IS NOT NULL THEN 'd' || c.digest_id
                    WHEN c.coalescing AND c.ordering_key IS NULL
                        THEN 'g' || (row_number() OVER (
                                         PARTITION BY c.webhook_id, c.digest_id IS NULL AND c.ordering_key IS NULL
                                         ORDER BY c.turn) - 1) / c.coalesce_max
                    ELSE 'r' || c.delivery_id
               END AS request
        FROM candidates c
    ), requests AS (
        SELECT g.webhook_id, g.request, count(*) AS size, max(g.quota) AS quota,
               max(g.priority) AS priority, min(g.next_retry_at) AS next_retry_at,
               min(g.delivery_id) AS first_id,
               row_number() OVER (PARTITION BY g.webhook_id ORDER BY min(g.turn)) AS turn
        FROM grouped g
        GROUP BY g.webhook_id, g.request
    ), picked_requests AS (
        SELECT r.*
        FROM requests r
        WHERE r.turn <= r.quota
        ORDER BY r.priority DESC, r.turn, r.next_retry_at, r.first_id
        LIMIT p_batch_size
    ), key_runs AS (
        -- The head of an ordering key, the endpoint coalescing, takes the rows of its key that
        -- follow it without a gap (due, not in flight, in no digest), up to coalesce_max in all:
        -- a digest of one key, in the key's order, sent and retried as one.
        SELECT g.webhook_id, g.request, f.delivery_id
        FROM grouped g
        JOIN picked_requests r ON r.webhook_id = g.webhook_id AND r.request = g.request
        CROSS JOIN LATERAL (
            SELECT x.delivery_id
            FROM (SELECT o.delivery_id,
                         bool_and(o.status IN ('pending', 'retrying') AND o.next_retry_at <= now()
                                  AND o.digest_id IS NULL) OVER (ORDER BY o.delivery_id) AS unbroken
                  FROM webhooks.alert_delivery_queue o
                  WHERE o.webhook_id = g.webhook_id AND o.ordering_key = g.ordering_key
                    AND o.delivery_id > g.delivery_id
                    AND o.status IN ('pending', 'retrying', 'delivering')
                  ORDER BY o.delivery_id
                  LIMIT g.coalesce_max - 1) x
            WHERE x.unbroken
        ) f
        WHERE g.coalescing AND g.ordering_key IS NOT NULL AND g.digest_id IS NULL
    ), new_digests AS (
        SELECT r.webhook_id, r.request, nextval('webhooks.digest_id_seq') AS digest_id
        FROM picked_requests r
        WHERE (r.request LIKE 'g%' AND r.size > 1)
           OR EXISTS (SELECT 1 FROM key_runs k WHERE k.webhook_id = r.webhook_id AND k.request = r.request)
    ), picked AS (
        SELECT g.delivery_id, n.digest_id AS new_digest_id
        FROM grouped g
        JOIN picked_requests r ON r.webhook_id = g.webhook_id AND r.request = g.request
        LEFT JOIN new_digests n ON n.webhook_id = g.webhook_id AND n.request = g.request
        UNION ALL
        SELECT k.delivery_id, n.digest_id
        FROM key_runs k
        JOIN new_digests n ON n.webhook_id = k.webhook_id AND n.request = k.request
        UNION ALL
        -- the other members of a failed digest, due or not (their jitter may differ): it retries
        -- as the same group; a member that expired or was replayed has left it
        SELECT m.delivery_id, NULL
        FROM grouped g
        JOIN picked_requests r ON r.webhook_id = g.webhook_id AND r.request = g.request
        JOIN webhooks.alert_delivery_queue m
          ON m.digest_id = g.digest_id AND m.delivery_id <> g.delivery_id
         AND m.status IN ('pending', 'retrying')
    ), claimed AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = 'delivering',
            attempts = q.attempts + 1,
            locked_by = p_worker_id,
            lease_token = gen_random_uuid(),
            locked_until = now() + make_interval(secs => p_lease_seconds),
            digest_id = coalesce(q.digest_id, (SELECT p.new_digest_id FROM picked p
                                               WHERE p.delivery_id = q.delivery_id)),
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
        -- tokens are per request: a digest costs one
        FROM (SELECT c.webhook_id, count(DISTINCT coalesce(c.digest_id, -c.delivery_id))::integer AS claimed
              FROM claimed c GROUP BY c.webhook_id) n
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
           cfg.retry_policy || e.retry_policy, q.digest_id
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

REVOKE ALL ON FUNCTION webhooks.acquire(text, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION webhooks.acquire(text, integer, integer) TO webhooks_worker;

CREATE OR REPLACE FUNCTION webhooks.finish(p_worker_id text, p_outcomes jsonb)
RETURNS TABLE (delivery_id bigint, applied boolean, status text, endpoint_change text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_delivery_ids bigint[];
    v_applied boolean[];
    v_statuses text[];
    v_endpoints jsonb;
    v_changes jsonb := '{}';
    s record;
    v_change text;
BEGIN
    WITH o AS (
        SELECT r.*, item.ord
        FROM jsonb_array_elements(p_outcomes) WITH ORDINALITY AS item(value, ord),
             jsonb_populate_record(NULL::webhooks.attempt_outcome, item.value) AS r
    ), cfg AS (
        SELECT max_attempts, max_deferrals FROM webhooks.delivery_config
    ), target AS (
        -- the rows as they were, with the decision each outcome leads to
        SELECT o.*, q.webhook_id, q.digest_id,
               -- a digest is one request: its first member alone speaks for it to the endpoint's
               -- health and circuit (037)
               q.digest_id IS NULL
                   OR o.delivery_id = min(o.delivery_id) OVER (PARTITION BY q.digest_id) AS speaks_for_request,
               CASE
                   WHEN o.outcome = 'delivered' THEN 'delivered'
                   WHEN o.outcome = 'dead_letter' THEN 'dead_letter'
                   WHEN o.outcome = 'deferred' AND q.deferrals < cfg.max_deferrals THEN 'deferred'
                   WHEN q.attempts >= coalesce(q.max_attempts, e.max_attempts, cfg.max_attempts)
                       THEN 'exhausted'
                   ELSE 'retry'
               END AS decision
        FROM o
        JOIN webhooks.alert_delivery_queue q ON q.delivery_id = o.delivery_id
        JOIN webhooks.endpoints e ON e.id = q.webhook_id
        CROSS JOIN cfg
    ), applied AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = CASE t.decision
                         WHEN 'delivered' THEN 'delivered'
                         WHEN 'dead_letter' THEN 'dead_letter'
                         WHEN 'exhausted' THEN 'dead_letter'
                         ELSE 'retrying'
                     END,
            attempts = CASE WHEN t.decision = 'deferred' THEN q.attempts - 1 ELSE q.attempts END,
            deferrals = CASE WHEN t.outcome = 'deferred' THEN q.deferrals + 1 ELSE q.deferrals END,
            next_retry_at = CASE WHEN t.decision IN ('retry', 'deferred')
                                 THEN now() + make_interval(secs => coalesce(t.retry_after_s, 0))
                                 ELSE q.next_retry_at END,
            locked_by = NULL, lease_token = NULL, locked_until = NULL,
            -- a digest that will go again keeps its members; a finished member leaves it (the
            -- audit log keeps which digest carried each attempt)
            digest_id = CASE WHEN t.decision IN ('retry', 'deferred') THEN q.digest_id END,
            last_http_status = t.http_status,
            last_error = t.error,
            failure_category = t.failure_category,
            dead_letter_reason = CASE t.decision
                                     WHEN 'dead_letter' THEN coalesce(t.reason, t.error)
                                     WHEN 'exhausted' THEN concat_ws(': ', 'attempts exhausted', t.error)
                                 END,
            delivered_at = CASE WHEN t.decision = 'delivered' THEN now() END,
            dead_lettered_at = CASE WHEN t.decision IN ('dead_letter', 'exhausted') THEN now() END,
            updated_at = now()
        -- Driven from the outcomes through the primary key, whatever the row estimates (`target`
        -- is estimated at 320 rows per outcome: delivery_config is never analyzed). No
        -- `status = 'delivering'` here: it let the planner read every leased row instead, and
        -- a matching token already means the row is delivering (lease_token_only_while_delivering).
        FROM target t
        WHERE q.delivery_id = ANY (ARRAY(SELECT t2.delivery_id FROM target t2))
          AND q.delivery_id = t.delivery_id AND q.lease_token = t.lease_token
        RETURNING q.delivery_id, q.status
    ), logged AS (
        INSERT INTO webhooks.alert_delivery_log
            (delivery_id, webhook_id, attempt, outcome, failure_category, http_status, latency_ms,
             error, response_excerpt, worker_id, lease_token, stale, digest_id)
        SELECT t.delivery_id, t.webhook_id, t.attempt,
               CASE t.decision WHEN 'exhausted' THEN 'dead_letter' ELSE t.decision END,
               t.failure_category, t.http_status, t.latency_ms,
               CASE WHEN t.decision = 'exhausted'
                    THEN concat_ws(': ', 'attempts exhausted', t.error) ELSE t.error END,
               left(t.response_excerpt, 1024), p_worker_id, t.lease_token, a.delivery_id IS NULL,
               t.digest_id
        FROM target t
        LEFT JOIN applied a ON a.delivery_id = t.delivery_id
        RETURNING 1
    ), per_outcome AS (
        SELECT t.*,
               -- A deferral (429 or 503 with Retry-After) is back-pressure from a receiver that
               -- answered: the pause below holds its rows, the circuit must not open on it (032).
               t.outcome NOT IN ('delivered', 'deferred')
                   AND webhooks.availability_failure(t.failure_category, t.http_status) AS unavailable,
               t.ord > coalesce(max(t.ord) FILTER (WHERE t.outcome = 'delivered')
                                OVER (PARTITION BY t.webhook_id), 0) AS after_last_success
        FROM target t
        -- A refused destination, and a request cut off because its worker shut down (category
        -- 'interrupted'), say nothing about the receiver: keep them out of the endpoint's state, or
        -- a cut-off half-open probe would count as a success and could close the circuit.
        WHERE coalesce(t.failure_category, '') NOT IN ('blocked', 'interrupted')
          AND t.speaks_for_request
    ), per_endpoint AS (
        SELECT p.webhook_id,
               count(*)::integer AS attempts,
               count(*) FILTER (WHERE p.outcome = 'delivered')::integer AS successes,
               count(*) FILTER (WHERE p.unavailable)::integer AS availability_failures,
               count(*) FILTER (WHERE p.outcome <> 'delivered' AND p.after_last_success)::integer
                   AS trailing_failures,
               coalesce(sum(p.latency_ms), 0)::bigint AS latency_ms,
               (array_agg(p.http_status ORDER BY p.ord DESC))[1] AS last_http_status,
               (array_agg(p.failure_category ORDER BY p.ord DESC)
                   FILTER (WHERE p.outcome <> 'delivered'))[1] AS last_failure_category,
               max(p.retry_after_s) FILTER (WHERE p.outcome = 'deferred') AS pause_seconds,
               min(p.delivery_id) FILTER (WHERE p.disable_endpoint) AS gone_delivery_id,
               (array_agg(p.delivery_id ORDER BY p.ord DESC))[1] AS last_delivery_id,
               (array_agg(p.attempt ORDER BY p.ord DESC))[1] AS last_attempt,
               count(*) FILTER (WHERE p.decision IN ('dead_letter', 'exhausted'))::integer AS dead_letters
        FROM per_outcome p
        GROUP BY p.webhook_id
    )
    -- (`logged` runs to completion although nothing reads it: data-modifying CTEs always do.)
    SELECT r.delivery_ids, r.applied, r.statuses,
           (SELECT jsonb_agg(to_jsonb(p) ORDER BY p.webhook_id) FROM per_endpoint p)
    INTO v_delivery_ids, v_applied, v_statuses, v_endpoints
    FROM (SELECT array_agg(o.delivery_id ORDER BY o.ord) AS delivery_ids,
                 array_agg(a.delivery_id IS NOT NULL ORDER BY o.ord) AS applied,
                 array_agg(coalesce(a.status, 'stale') ORDER BY o.ord) AS statuses
          FROM o LEFT JOIN applied a ON a.delivery_id = o.delivery_id) r;

    FOR s IN
        SELECT * FROM jsonb_to_recordset(coalesce(v_endpoints, '[]')) AS x(
            webhook_id bigint, attempts integer, successes integer, availability_failures integer,
            trailing_failures integer, latency_ms bigint, last_http_status integer,
            last_failure_category text, pause_seconds double precision, gone_delivery_id bigint,
            last_delivery_id bigint, last_attempt integer, dead_letters integer)
        ORDER BY x.webhook_id
    LOOP
        v_change := webhooks.record_endpoint_outcomes(
            s.webhook_id, 'worker ' || p_worker_id, s.attempts, s.successes,
            s.availability_failures, s.trailing_failures, s.latency_ms, s.last_http_status,
            s.last_failure_category, s.pause_seconds, s.gone_delivery_id, s.last_delivery_id,
            s.last_attempt, s.dead_letters);
        IF v_change IS NOT NULL THEN
            v_changes := v_changes || jsonb_build_object(
                coalesce(s.gone_delivery_id, s.last_delivery_id)::text, v_change);
        END IF;
    END LOOP;

    RETURN QUERY
    SELECT r.delivery_id, r.applied, r.status, v_changes ->> r.delivery_id::text
    FROM unnest(v_delivery_ids, v_applied, v_statuses) WITH ORDINALITY AS r(delivery_id, applied, status, ord)
    ORDER BY r.ord;
END;
$$;

