-- claim: taking due rows to send, and giving back what was not sent. Short transactions, never held
-- across HTTP.
--
-- webhooks.acquire(worker, batch, lease), the claim:
-- 1. Rows whose lease expired (a crashed or stalled worker) become claimable again or, if the lost
--    attempt was their last, dead letters with reason 'lease expired'; rows past their expires_at
--    become dead letters ('expired').
-- 2. The endpoints that may send now are locked with SKIP LOCKED, at most p_batch_size of them,
--    least recently looked at first: active, not paused by Retry-After, circuit not open (an open
--    circuit whose sleep is over turns half-open here), with claimable rows. Locking the endpoint's
--    state row is what makes its limits hold across the fleet: no two claims for one endpoint run
--    at once, and none ever waits for another.
-- 3. In a new statement (so it sees every claim committed before the lock), each endpoint gets a
--    quota: the least of its free concurrency (max_in_flight minus rows in flight), its rate
--    tokens, its remaining half-open probes, and the batch size. Each endpoint's claimable rows are
--    taken in priority, then due-time order, up to its quota. The batch is filled by priority, then
--    round-robin across endpoints, so a large backlog on one endpoint never starves the others.
--    Rows of a limited endpoint are not touched: they wait in the table. One endpoint that makes no
--    digest and answers to no tenant limit takes a short statement that does the same.
-- 4. Each claimed row gets a new lease token (the fencing token webhooks.finish() checks) and its
--    attempt is counted now, so a payload that crashes workers cannot loop forever; the endpoints'
--    rate tokens are debited, and every endpoint looked at goes to the back of the line when
--    another endpoint that may send was left waiting, in the same statement (one write of each
--    endpoint's state row per claim, not two; none for an endpoint that got nothing and whose
--    place does not change).
-- 5. Each row comes with its tenant's name and rank (place by id), from which the worker makes
--    the `tenant` label of its delivery counter, and the networks the operator granted the tenant,
--    which the worker's destination check applies (worker/rules/destinations.py).
-- webhooks.next_due_in(): how long an idle worker may sleep before a row becomes claimable or a
-- lease expires. webhooks.release(): rows claimed but not sent at shutdown go back with their
-- attempt given back. A row given back (released, its lease expired, its worker lost) keeps its
-- place in the queue: it is claimed before the rows that were waiting behind it.

-- Rows a claim may take once they are due: waiting (pending or retrying) and, with an ordering key,
-- the first unfinished row of their key (earlier rows of the key, in flight included, go first).
-- Claimable now is a row of this view with next_retry_at <= now(). acquire(), next_due_in() and the
-- held_back view all read it here, so they cannot disagree (two copies that did once made idle
-- workers wake to claim twenty times a second). A view, not a function: the planner inlines it into
-- each query and keeps using the partial indexes; a function called per row was never inlined and
-- cost more than the rest of the claim's scan.
CREATE OR REPLACE VIEW webhooks.claimable AS
SELECT q.delivery_id, q.webhook_id, q.priority, q.next_retry_at, q.digest_id, q.ordering_key
FROM webhooks.alert_delivery_queue q
WHERE q.status IN ('pending', 'retrying')
  AND (q.ordering_key IS NULL OR NOT EXISTS (
      SELECT 1 FROM webhooks.alert_delivery_queue o
      WHERE o.webhook_id = q.webhook_id AND o.ordering_key = q.ordering_key
        AND o.delivery_id < q.delivery_id
        AND o.status IN ('pending', 'retrying', 'delivering')));

-- The rows a claim may take as the first of a request: claimable rows, of a digest that failed
-- only its first waiting member (it stands for the digest, which goes again as one request).
CREATE OR REPLACE VIEW webhooks.request_heads AS
SELECT q.delivery_id, q.webhook_id, q.priority, q.next_retry_at, q.digest_id, q.ordering_key
FROM webhooks.claimable q
WHERE q.digest_id IS NULL OR NOT EXISTS (
    SELECT 1 FROM webhooks.alert_delivery_queue m
    WHERE m.digest_id = q.digest_id AND m.delivery_id < q.delivery_id
      AND m.status IN ('pending', 'retrying'));

-- A tenant's place among the tenants by id (1: the first), at most 10001, from which the worker makes
-- its metrics' `tenant` label: the name for the first tenants (its http.endpoint_label_limit, at
-- most 10000), `other` after them, as in queue_stats(). Tenants are never deleted, so a rank never
-- changes; counting it reads at most 10000 index entries.
-- (PL/pgSQL, so its plan is kept for the session: a SQL function that cannot be inlined, as a count
-- cannot, is planned again in every statement that calls it.)
CREATE OR REPLACE FUNCTION webhooks.tenant_rank(p_tenant_id bigint) RETURNS integer
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN 1 + (SELECT count(*)::integer
                FROM (SELECT 1 FROM webhooks.tenants o WHERE o.id < p_tenant_id
                      ORDER BY o.id LIMIT 10000) earlier);
END;
$$;

-- Ends the leases of the given rows that are still in flight (the caller holds their locks): each
-- goes back to `retrying`, due now, with its attempt still counted (the request may have been
-- sent), or to `dead_letter` with reason `lease expired` if that was its last attempt; each gets an
-- audit row (outcome lease_expired) with the worker and lease it had. p_cause says why the lease
-- ended early, if it did (in last_error; p_logged_cause in the audit row). The one rule for expired
-- leases (reap_expired_leases) and lost workers (reclaim_rows_of, liveness.sql).
-- A row that comes back keeps its place in its endpoint's queue: its due time stays the one it was
-- claimed at (no later than now), so it goes before the rows that were waiting behind it. Made due
-- at now(), it went to the back: under a backlog a lost worker's rows, back within 1.4 s, were
-- resent after 12.7 s. The claim's order and indexes are unchanged; the row's old key
-- in the claimable index is simply an early one.
CREATE OR REPLACE FUNCTION webhooks.end_leases(p_delivery_ids bigint[], p_cause text DEFAULT NULL,
                                               p_logged_cause text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    WITH cfg AS (
        SELECT max_attempts FROM webhooks.delivery_config
    ), ended AS (
        SELECT q.delivery_id, q.lease_token, q.locked_by,
               q.attempts >= coalesce(q.max_attempts, e.max_attempts, cfg.max_attempts) AS exhausted
        FROM webhooks.alert_delivery_queue q
        JOIN webhooks.endpoints e ON e.id = q.webhook_id
        CROSS JOIN cfg
        WHERE q.delivery_id = ANY (p_delivery_ids) AND q.status = 'delivering'
    ), returned AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = CASE WHEN x.exhausted THEN 'dead_letter' ELSE 'retrying' END,
            -- its place (a failed digest's members go with it due or not: none comes back later
            -- than now)
            next_retry_at = least(q.next_retry_at, now()),
            locked_by = NULL, lease_token = NULL, locked_until = NULL,
            failure_category = 'internal',
            last_error = concat_ws(': ', 'lease expired', p_cause),
            dead_letter_reason = CASE WHEN x.exhausted THEN 'lease expired' END,
            dead_lettered_at = CASE WHEN x.exhausted THEN now() END,
            updated_at = now()
        FROM ended x
        WHERE q.delivery_id = x.delivery_id
        RETURNING q.delivery_id, q.webhook_id, q.attempts, q.status, x.lease_token, x.locked_by
    ), logged AS (
        INSERT INTO webhooks.alert_delivery_log
            (delivery_id, webhook_id, attempt, outcome, failure_category, error, worker_id, lease_token)
        SELECT delivery_id, webhook_id, attempts, 'lease_expired', 'internal',
               concat_ws(': ', CASE WHEN status = 'dead_letter' THEN 'lease expired on the last attempt'
                                    ELSE 'lease expired' END,
                         p_logged_cause),
               locked_by, lease_token
        FROM returned
        RETURNING 1
    )
    SELECT count(*)::integer INTO v_count FROM logged;
    RETURN v_count;
END;
$$;

-- Rows whose lease ran out (their worker crashed, stalled or was cut off) go back to the queue, at
-- most p_limit per call, oldest lease first. Every claim calls this first, so it asks the (small)
-- partial index of leased rows whether there is anything to do before doing it.
CREATE OR REPLACE FUNCTION webhooks.reap_expired_leases(p_limit integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql
SET jit = off
-- PostgreSQL's own choice of generic or custom plan, whatever its caller (acquire) forces: its
-- LIMIT is a parameter (acquire's enable_seqscan = off holds here too; its indexes serve it)
SET plan_cache_mode = auto
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhooks.alert_delivery_queue
                   WHERE status = 'delivering' AND locked_until < now()) THEN
        RETURN 0;
    END IF;
    RETURN webhooks.end_leases(ARRAY(
        SELECT q.delivery_id FROM webhooks.alert_delivery_queue q
        WHERE q.status = 'delivering' AND q.locked_until < now()
        ORDER BY q.locked_until
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED));
END;
$$;

CREATE OR REPLACE FUNCTION webhooks.expire_deliveries(p_limit integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql
SET jit = off
-- PostgreSQL's own choice of generic or custom plan, whatever its caller (acquire) forces: its
-- LIMIT is a parameter (acquire's enable_seqscan = off holds here too; its indexes serve it)
SET plan_cache_mode = auto
AS $$
DECLARE
    v_count integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhooks.alert_delivery_queue
                   WHERE expires_at < now() AND expires_at IS NOT NULL
                     AND status IN ('pending', 'retrying')) THEN
        RETURN 0;
    END IF;
    WITH expired AS (
        SELECT q.delivery_id FROM webhooks.alert_delivery_queue q
        WHERE q.expires_at < now() AND q.expires_at IS NOT NULL AND q.status IN ('pending', 'retrying')
        ORDER BY q.expires_at
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), dead AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = 'dead_letter', failure_category = 'expired',
            dead_letter_reason = 'expired before delivery', last_error = 'expired before delivery',
            dead_lettered_at = now(), updated_at = now()
        FROM expired x WHERE q.delivery_id = x.delivery_id
        RETURNING q.delivery_id, q.webhook_id, q.attempts
    ), logged AS (
        INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome, failure_category, error)
        SELECT delivery_id, webhook_id, attempts, 'dead_letter', 'expired', 'expired before delivery' FROM dead
        RETURNING 1
    )
    SELECT count(*)::integer INTO v_count FROM logged;
    RETURN v_count;
END;
$$;

-- What each of the given endpoints (their state rows locked by the caller) may still send now, in
-- requests: the least of its free concurrency (max_in_flight minus requests in flight), its rate
-- tokens (refilled up to p_at), its half-open probes left, and the batch. Both of acquire()'s claims
-- read it, and each inlines it (a plain SQL function, not SECURITY DEFINER, not VOLATILE) into its
-- own plan.
CREATE OR REPLACE FUNCTION webhooks.endpoint_quotas(p_endpoints bigint[], p_batch_size integer,
                                                    p_at timestamptz)
RETURNS TABLE (
    webhook_id      bigint,
    tenant_id       bigint,
    circuit_state   text,
    rate            numeric,           -- requests per second; NULL: unlimited
    tokens_now      double precision,  -- the rate tokens at p_at; NULL: unlimited
    coalesce_max    integer,           -- NULL: the endpoint does not coalesce
    coalesce_window interval,
    quota           integer
)
LANGUAGE sql STABLE
AS $$
    SELECT t.webhook_id, t.tenant_id, t.circuit_state, t.rate, t.tokens_now, t.coalesce_max,
           t.coalesce_window,
           least(
               p_batch_size,
               t.max_in_flight - t.flying,
               CASE WHEN t.rate IS NULL THEN p_batch_size ELSE floor(t.tokens_now)::integer END,
               -- Half-open: probes not yet answered are the rows in flight, so a probe lost to a
               -- crash or a release frees its place again instead of wedging the circuit.
               CASE t.circuit_state WHEN 'open' THEN t.probes
                                    WHEN 'half_open' THEN t.probes - t.probe_results - t.flying
                                    ELSE p_batch_size END
           ) AS quota
    FROM (
        SELECT l.*,
               CASE WHEN l.rate IS NOT NULL THEN least(l.burst::double precision,
                   coalesce(l.rate_tokens, l.burst) + l.rate::double precision * greatest(0,
                       extract(epoch FROM p_at - coalesce(l.rate_refilled_at, p_at))))
               END AS tokens_now,
               f.flying
        FROM (
            SELECT h.webhook_id, e.tenant_id, h.circuit_state,
                   h.probe_successes + h.probe_failures AS probe_results,
                   coalesce(e.max_in_flight, cfg.max_in_flight) AS max_in_flight,
                   coalesce(e.rate_limit_per_second, cfg.rate_limit_per_second) AS rate,
                   coalesce(e.rate_limit_burst, cfg.rate_limit_burst,
                            greatest(1, ceil(coalesce(e.rate_limit_per_second, cfg.rate_limit_per_second))))
                       AS burst,
                   coalesce((e.circuit_policy ->> 'probes')::integer, cfg.circuit_probes) AS probes,
                   h.rate_tokens, h.rate_refilled_at,
                   -- raw and pagerduty bodies are never coalesced (a constraint keeps them unset)
                   CASE WHEN e.body_format IN ('slack', 'mattermost', 'envelope') THEN e.coalesce_max END
                       AS coalesce_max,
                   e.coalesce_window
            FROM webhooks.webhook_health_metrics h
            JOIN webhooks.endpoints e ON e.id = h.webhook_id
            CROSS JOIN webhooks.delivery_config cfg
            WHERE h.webhook_id = ANY (p_endpoints)
        ) l
        -- a join, not a scalar subquery in the select list: the quota reads `flying` twice (the
        -- concurrency cap, the half-open probe budget), and each read of an inlined subquery ran
        -- the count again
        CROSS JOIN LATERAL (
            -- requests, not rows: a digest in flight is one request however many rows it carries
            SELECT count(DISTINCT coalesce(d.digest_id, -d.delivery_id))::integer AS flying
            FROM webhooks.alert_delivery_queue d
            WHERE d.webhook_id = l.webhook_id AND d.status = 'delivering' AND d.locked_until > now()
        ) f
    ) t
$$;
-- acquire() (its owner) inlines it; nobody else needs it
REVOKE EXECUTE ON FUNCTION webhooks.endpoint_quotas(bigint[], integer, timestamptz) FROM PUBLIC;

-- acquire()'s steps, each a function of its own, in the order it calls them. Only acquire() calls
-- them (PUBLIC may not): they run under its settings (a generic plan, seq scans off) and as its
-- owner, and each keeps its plans for the session as acquire() itself did.

-- Step 2: the endpoints this claim may serve, locked (SKIP LOCKED), at most p_batch_size, each
-- tenant's least recently served first; and whether the line moves (line_moves: this claim left an
-- endpoint that may send waiting).
CREATE OR REPLACE FUNCTION webhooks.lock_claimable_endpoints(p_batch_size integer, p_tenants text[],
                                                             p_exclude_tenants text[],
                                                             OUT endpoints bigint[], OUT line_moves boolean)
LANGUAGE plpgsql
AS $$
DECLARE
    v_endpoints bigint[];
    v_walk bigint;
    v_walk_cut boolean;
    v_walked bigint;
BEGIN
    -- Each tenant's line is walked up to v_walk endpoints that may send (twice the batch: the claim
    -- never takes more, and other claims may hold some). Claims of a fleet overlap, and when they
    -- hold all of a tenant's first v_walk (three claims at once can), the walk goes further: with a
    -- fixed bound the claim came back empty although endpoints behind those were free and due.
    v_walk := 2 * p_batch_size;
    LOOP
        WITH ranked AS MATERIALIZED (
            -- Tenants first, then their endpoints: each tenant's least recently served endpoint
            -- comes before any tenant's second, so a tenant with a hundred endpoints takes no more
            -- of the claim than a tenant with one. (A window function cannot sit beside FOR
            -- UPDATE, hence the ranking apart from the locking.)
            SELECT c.webhook_id,
                   row_number() OVER (PARTITION BY c.tenant_id
                                      ORDER BY c.last_claimed_at NULLS FIRST, c.webhook_id) AS tenant_turn,
                   count(*) OVER (PARTITION BY c.tenant_id) AS walked
            FROM webhooks.tenants t
            -- Each tenant's endpoints in the line's order (webhook_health_metrics_claim_order), up
            -- to v_walk of those that may send and have a due row. Ranking every endpoint instead
            -- cost a probe of the queue per endpoint per claim (94 ms per claim over 10,000
            -- endpoints).
            CROSS JOIN LATERAL (
                SELECT h2.webhook_id, h2.tenant_id, h2.last_claimed_at
                FROM webhooks.webhook_health_metrics h2
                JOIN webhooks.endpoints e ON e.id = h2.webhook_id
                WHERE h2.tenant_id = t.id
                  AND e.active
                  AND (h2.paused_until IS NULL OR h2.paused_until <= now())
                  AND h2.circuit_state <> 'forced_open'
                  AND (h2.circuit_state <> 'open' OR h2.circuit_open_until <= now())
                  -- Asked endpoint by endpoint, its first due row (a subquery, not EXISTS): as a
                  -- join, a plan made while the queue was small listed the endpoints of every due
                  -- row, the whole backlog that came later, per claim; without the order, one read
                  -- all the endpoint's rows, delivered ones too.
                  AND (SELECT true FROM webhooks.claimable q
                       WHERE q.webhook_id = h2.webhook_id AND q.next_retry_at <= now()
                       ORDER BY q.next_retry_at LIMIT 1)
                ORDER BY h2.last_claimed_at NULLS FIRST, h2.webhook_id
                LIMIT v_walk
            ) c
            -- a pool serves only its tenants (worker.tenants / worker.exclude_tenants)
            WHERE (p_tenants IS NULL OR t.name = ANY (p_tenants))
              AND (p_exclude_tenants IS NULL OR NOT t.name = ANY (p_exclude_tenants))
        )
        SELECT array_agg(x.webhook_id ORDER BY x.webhook_id),
               coalesce((SELECT max(r.walked) FROM ranked r), 0) >= v_walk,
               (SELECT count(*) FROM ranked r)
        INTO v_endpoints, v_walk_cut, v_walked
        FROM (
            SELECT h.webhook_id
            FROM webhooks.webhook_health_metrics h
            JOIN ranked r ON r.webhook_id = h.webhook_id
            -- Again on the locked row itself: when a finish updates it while this claim waits to
            -- lock it, PostgreSQL re-checks only the locked row's own conditions against its new
            -- version, so a Retry-After pause or an opened circuit the finish just wrote is seen
            -- here.
            WHERE (h.paused_until IS NULL OR h.paused_until <= now())
              AND h.circuit_state <> 'forced_open'
              AND (h.circuit_state <> 'open' OR h.circuit_open_until <= now())
            -- least recently served first, and a bounded number: a claim never locks every endpoint
            ORDER BY r.tenant_turn, h.last_claimed_at NULLS FIRST, h.webhook_id
            LIMIT p_batch_size
            FOR UPDATE OF h SKIP LOCKED
        ) x;
        -- (what this claim locked stays locked: a further walk takes it again, as its own lock)
        EXIT WHEN coalesce(cardinality(v_endpoints), 0) >= p_batch_size OR NOT v_walk_cut;
        v_walk := v_walk * 4;
    END LOOP;
    IF v_endpoints IS NULL THEN
        RETURN;
    END IF;
    -- The line moves (the endpoints locked here go to its back) only when this claim left an
    -- endpoint that may send waiting: one it did not reach, or one another claim holds. When it
    -- locked every endpoint that may send, nobody waits behind them and their order does not
    -- matter, so their state rows keep last_claimed_at, which the line's index is keyed on: the
    -- update of those rows stays heap-only (HOT), and a claim that takes nothing writes nothing.
    -- Why: a busy endpoint's state row was rewritten with new index entries twice a second per
    -- worker; its dead versions piled up in the table and its indexes between two autovacuums,
    -- and every claim and finish walked them.
    endpoints := v_endpoints;
    line_moves := v_walk_cut OR v_walked > cardinality(v_endpoints);
END;
$$;
REVOKE EXECUTE ON FUNCTION webhooks.lock_claimable_endpoints(integer, text[], text[]) FROM PUBLIC;

-- Step 3, which claim: true for one endpoint that makes no digest, answers to no tenant limit and
-- has no circuit to half-open, which claim_from_one_endpoint() serves.
CREATE OR REPLACE FUNCTION webhooks.is_one_plain_endpoint(p_endpoints bigint[]) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_one_plain_endpoint boolean := false;
BEGIN
    -- One endpoint that makes no digest, answers to no tenant limit and has no circuit to half-open
    -- (the usual claim of a row or two, woken by their NOTIFY) takes the short claim,
    -- claim_from_one_endpoint(): the full claim without the steps only those cases need, so the
    -- same rows. The full claim's plan,
    -- about 170 nodes, cost more to start than a one-row claim's work. The setting
    -- webhooks.claim_path = 'full' sends every claim the long way (the tests compare the two).
    IF cardinality(p_endpoints) = 1
       AND current_setting('webhooks.claim_path', true) IS DISTINCT FROM 'full' THEN
        -- (coalesce_max is set only for bodies that can coalesce: endpoints_coalesce_format)
        SELECT h.circuit_state <> 'open' AND e.coalesce_max IS NULL
               AND t.rate_limit_per_second IS NULL AND t.max_in_flight IS NULL
        INTO v_one_plain_endpoint
        FROM webhooks.webhook_health_metrics h
        JOIN webhooks.endpoints e ON e.id = h.webhook_id
        JOIN webhooks.tenants t ON t.id = e.tenant_id
        WHERE h.webhook_id = p_endpoints[1];
    END IF;
    RETURN coalesce(v_one_plain_endpoint, false);
END;
$$;
REVOKE EXECUTE ON FUNCTION webhooks.is_one_plain_endpoint(bigint[]) FROM PUBLIC;

-- Step 3 and 4, the short claim: one plain endpoint's rows (is_one_plain_endpoint()), as
-- claim_from_endpoints() would take them, leased, counted, its tokens debited.
CREATE OR REPLACE FUNCTION webhooks.claim_from_one_endpoint(p_worker_id text, p_batch_size integer,
                                                            p_lease_seconds integer, p_endpoints bigint[],
                                                            p_line_moves boolean)
RETURNS SETOF webhooks.claimed_delivery
LANGUAGE plpgsql
AS $$
BEGIN
    RAISE DEBUG 'acquire: the short claim, endpoint %', p_endpoints[1];
    RETURN QUERY
    WITH cfg AS (
        SELECT * FROM webhooks.delivery_config
    ), clock AS (
        SELECT clock_timestamp() AS now_exact
    ), quota AS (
        SELECT qt.*
        FROM clock CROSS JOIN LATERAL webhooks.endpoint_quotas(p_endpoints, p_batch_size, clock.now_exact) qt
    ), heads AS (
        -- one request each: a row of its own, or the first waiting member of a failed digest
        SELECT r.delivery_id, r.digest_id
        FROM quota qt
        CROSS JOIN LATERAL (
            SELECT q.delivery_id, q.digest_id
            FROM webhooks.request_heads q
            WHERE q.webhook_id = qt.webhook_id AND q.next_retry_at <= now()
            ORDER BY q.priority DESC, q.next_retry_at, q.delivery_id
            LIMIT greatest(qt.quota, 0)
        ) r
    ), picked AS (
        SELECT hd.delivery_id FROM heads hd
        UNION ALL
        -- the other members of a failed digest, as in the full claim
        SELECT m.delivery_id
        FROM heads hd
        JOIN webhooks.alert_delivery_queue m
          ON m.digest_id = hd.digest_id AND m.delivery_id <> hd.delivery_id
         -- (waiting; written to match the digest index and not the indexes of waiting rows the
         -- claim reads, `claimable` and `due`: see `claimed`)
         AND m.status IN ('pending', 'retrying', 'delivering') AND m.status <> 'delivering'
    ), claimed AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = 'delivering',
            attempts = q.attempts + 1,
            locked_by = p_worker_id,
            lease_token = gen_random_uuid(),
            locked_until = now() + make_interval(secs => p_lease_seconds),
            updated_at = now()
        -- (by primary key, as in the full claim)
        WHERE q.delivery_id = ANY (ARRAY(SELECT p.delivery_id FROM picked p))
          AND q.status NOT IN ('delivering', 'delivered', 'dead_letter')
        RETURNING q.*
    ), debited AS (
        UPDATE webhooks.webhook_health_metrics h
        SET rate_tokens = CASE WHEN n.claimed = 0 THEN h.rate_tokens
                               WHEN qt.rate IS NOT NULL THEN qt.tokens_now - n.claimed END,
            rate_refilled_at = CASE WHEN n.claimed = 0 THEN h.rate_refilled_at
                                    WHEN qt.rate IS NOT NULL THEN clock.now_exact END,
            last_claimed_at = CASE WHEN p_line_moves THEN clock.now_exact ELSE h.last_claimed_at END,
            updated_at = CASE WHEN n.claimed = 0 THEN h.updated_at ELSE now() END
        FROM quota qt
        CROSS JOIN (SELECT count(DISTINCT coalesce(c.digest_id, -c.delivery_id))::integer AS claimed
                    FROM claimed c) n
        CROSS JOIN clock
        WHERE h.webhook_id = qt.webhook_id AND (n.claimed > 0 OR p_line_moves)
        RETURNING 1
    ), claimed_tenants AS MATERIALIZED (  -- (as in the full claim)
        SELECT t.id, t.name, webhooks.tenant_rank(t.id) AS rank, t.allow_networks
        FROM webhooks.tenants t
        WHERE t.id = ANY (ARRAY(SELECT DISTINCT c.tenant_id FROM claimed c))
    )
    SELECT q.delivery_id, q.webhook_id, q.event_id, q.idempotency_key, q.event_type,
           coalesce(m.payload, q.payload)::text, q.attempts,
           coalesce(q.max_attempts, e.max_attempts, cfg.max_attempts),
           q.deferrals, q.replays, q.lease_token, q.locked_until, q.traceparent,
           e.url, e.signing_secrets, e.headers, e.body_format, e.secret_settings, e.timeout_ms,
           coalesce(e.retry_schedule, cfg.retry_schedule), cfg.retry_jitter, q.created_at,
           cfg.retry_policy || e.retry_policy, q.digest_id, ct.name, ct.rank,
           ct.allow_networks
    FROM claimed q
    -- the payload is the message's (a row inserted with the triggers off keeps its own)
    LEFT JOIN webhooks.messages m ON m.message_id = q.message_id
    JOIN webhooks.endpoints e ON e.id = q.webhook_id
    JOIN claimed_tenants ct ON ct.id = q.tenant_id
    CROSS JOIN cfg
    ORDER BY q.priority DESC, q.delivery_id;
END;
$$;
REVOKE EXECUTE ON FUNCTION webhooks.claim_from_one_endpoint(text, integer, integer, bigint[], boolean)
    FROM PUBLIC;

-- Step 3, for the full claim: the limited tenants of the locked endpoints, locked as the endpoints
-- are; a limited tenant another claim holds sends nothing in this claim.
CREATE OR REPLACE FUNCTION webhooks.lock_limited_tenants(p_endpoints bigint[]) RETURNS bigint[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_tenants bigint[];
BEGIN
    -- The limited tenants of these endpoints, locked as the endpoints are (SKIP LOCKED: a claim
    -- never waits for another); a limited tenant another claim holds sends nothing in this one.
    SELECT array_agg(x.id) INTO v_tenants
    FROM (
        SELECT t.id FROM webhooks.tenants t
        WHERE t.id IN (SELECT e.tenant_id FROM webhooks.endpoints e WHERE e.id = ANY (p_endpoints))
          AND (t.rate_limit_per_second IS NOT NULL OR t.max_in_flight IS NOT NULL)
        ORDER BY t.id
        FOR UPDATE OF t SKIP LOCKED
    ) x;
    RETURN v_tenants;
END;
$$;
REVOKE EXECUTE ON FUNCTION webhooks.lock_limited_tenants(bigint[]) FROM PUBLIC;

-- Steps 3 to 5, the full claim: quotas of the locked endpoints and their tenants, coalescing, the
-- batch shared between tenants and then across each tenant's endpoints, ordering keys and
-- digests; the rows leased and counted, tokens debited, the line moved (p_line_moves), a circuit
-- whose sleep is over half-opened; each row with its endpoint's settings and tenant.
CREATE OR REPLACE FUNCTION webhooks.claim_from_endpoints(p_worker_id text, p_batch_size integer,
                                                         p_lease_seconds integer, p_endpoints bigint[],
                                                         p_tenants bigint[], p_line_moves boolean)
RETURNS SETOF webhooks.claimed_delivery
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN QUERY
    WITH cfg AS (
        SELECT * FROM webhooks.delivery_config
    ), clock AS (
        SELECT clock_timestamp() AS now_exact
    ), quota AS (
        SELECT qt.*
        FROM clock CROSS JOIN LATERAL webhooks.endpoint_quotas(p_endpoints, p_batch_size, clock.now_exact) qt
    ), tenant_quota AS (
        -- What each tenant may still send now, across all its endpoints and the fleet: the least
        -- of its free concurrency and its rate tokens (requests, as for endpoints); unlimited,
        -- the batch; limited but held by another claim, nothing.
        SELECT t.id AS tenant_id, t.rate_limit_per_second AS rate, tt.tokens_now,
               CASE WHEN t.rate_limit_per_second IS NULL AND t.max_in_flight IS NULL THEN p_batch_size
                    WHEN NOT t.id = ANY (coalesce(p_tenants, '{}')) THEN 0
                    ELSE least(p_batch_size,
                               t.max_in_flight - f.flying,
                               floor(tt.tokens_now)::integer)
               END AS quota
        FROM webhooks.tenants t
        CROSS JOIN clock
        CROSS JOIN LATERAL (
            SELECT CASE WHEN t.rate_limit_per_second IS NOT NULL THEN least(tb.burst::double precision,
                       coalesce(t.rate_tokens, tb.burst) + t.rate_limit_per_second::double precision
                           * greatest(0, extract(epoch FROM clock.now_exact
                                                  - coalesce(t.rate_refilled_at, clock.now_exact))))
                   END AS tokens_now
            FROM (SELECT coalesce(t.rate_limit_burst,
                                  greatest(1, ceil(t.rate_limit_per_second))::integer) AS burst) tb
        ) tt
        CROSS JOIN LATERAL (
            SELECT count(DISTINCT coalesce(d.digest_id, -d.delivery_id))::integer AS flying
            FROM webhooks.alert_delivery_queue d
            WHERE t.max_in_flight IS NOT NULL
              AND d.tenant_id = t.id AND d.status = 'delivering' AND d.locked_until > now()
        ) f
        WHERE t.id IN (SELECT qt.tenant_id FROM quota qt)
    ), backlog AS (
        -- Coalescing starts only when more rows wait than the limits let through now, or when the
        -- oldest due row has waited coalesce_window for company: a lone row goes alone. Counted up
        -- to one past the quota, so a storm costs no more to look at than a trickle.
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
            -- here, not in the join's ON, which filters what the count returns but does not stop
            -- it: it counted a batch of rows for every endpoint, coalescing or not
            WHERE qt.coalesce_max IS NOT NULL
        ) w ON true
    ), heads AS (
        -- Each endpoint's first candidate, and how many other endpoints of its tenant have a first
        -- candidate of at least its priority: each of those comes before this endpoint's second
        -- request in the tenant's order (priority, then turn), so at most batch - that many of its
        -- requests can be picked. Bounding the candidates of an endpoint that does not coalesce
        -- (one row, one request) by it picks exactly the same rows, and keeps a claim over a
        -- hundred endpoints with backlogs to about a hundred candidates rather than ten thousand,
        -- which took 80 ms a claim. A coalescing endpoint keeps the whole quota: its rows group
        -- into requests only further on, where a cut could split a group.
        SELECT qt.webhook_id,
               count(*) OVER (PARTITION BY qt.tenant_id ORDER BY hd.priority DESC
                              RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - 1 AS endpoints_ahead
        FROM backlog qt
        CROSS JOIN LATERAL (
            SELECT q.priority
            FROM webhooks.request_heads q
            WHERE q.webhook_id = qt.webhook_id AND q.next_retry_at <= now()
            ORDER BY q.priority DESC, q.next_retry_at, q.delivery_id
            LIMIT 1
        ) hd
        WHERE qt.quota > 0
    ), candidates AS (
        SELECT qt.webhook_id, qt.quota, qt.coalescing, qt.coalesce_max,
               r.delivery_id, r.priority, r.next_retry_at, r.digest_id, r.ordering_key,
               row_number() OVER (PARTITION BY qt.webhook_id
                                  ORDER BY r.priority DESC, r.next_retry_at, r.delivery_id) AS turn
        FROM backlog qt
        JOIN heads hd ON hd.webhook_id = qt.webhook_id
        CROSS JOIN LATERAL (
            SELECT q.delivery_id, q.priority, q.next_retry_at, q.digest_id, q.ordering_key
            FROM webhooks.request_heads q
            WHERE q.webhook_id = qt.webhook_id AND q.next_retry_at <= now()
            ORDER BY q.priority DESC, q.next_retry_at, q.delivery_id
            -- the quota counts requests: coalescing, each may carry coalesce_max rows
            LIMIT CASE WHEN qt.coalescing THEN qt.quota * qt.coalesce_max
                       ELSE least(qt.quota, greatest(1, p_batch_size - hd.endpoints_ahead)) END
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
    ), tenant_requests AS (
        -- Each tenant's requests in its own order (priority, then round-robin across its
        -- endpoints): its turn is how many of its requests come before.
        SELECT r.*, l.tenant_id,
               row_number() OVER (PARTITION BY l.tenant_id
                                  ORDER BY r.priority DESC, r.turn, r.next_retry_at, r.first_id) AS tenant_turn
        FROM requests r
        JOIN quota l ON l.webhook_id = r.webhook_id
        WHERE r.turn <= r.quota
    ), picked_requests AS (
        -- The batch is shared between tenants first (round-robin over their turns), then within
        -- each by priority and across its endpoints; a tenant's limits cap its share.
        SELECT r.*
        FROM tenant_requests r
        JOIN tenant_quota tq ON tq.tenant_id = r.tenant_id
        WHERE r.tenant_turn <= tq.quota
        ORDER BY r.tenant_turn, r.priority DESC, r.turn, r.next_retry_at, r.first_id
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
         -- (waiting; written to match the digest index and not the indexes of waiting rows the
         -- claim reads, `claimable` and `due`: see `claimed`)
         AND m.status IN ('pending', 'retrying', 'delivering') AND m.status <> 'delivering'
    ), claimed AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = 'delivering',
            attempts = q.attempts + 1,
            locked_by = p_worker_id,
            lease_token = gen_random_uuid(),
            locked_until = now() + make_interval(secs => p_lease_seconds),
            -- (looked up row by row only when the claim made a digest: the lookup reads `picked`
            -- whole for each row)
            digest_id = coalesce(q.digest_id,
                                 CASE WHEN EXISTS (SELECT 1 FROM new_digests)
                                      THEN (SELECT p.new_digest_id FROM picked p
                                            WHERE p.delivery_id = q.delivery_id) END),
            updated_at = now()
        -- By primary key whatever the row estimates. Joined to `picked`, a plan made without the
        -- batch size (a generic plan) hashed the picked rows and scanned the whole queue. And a
        -- plan made while the queue was nearly empty read the rows through an index of every
        -- waiting row, the whole backlog that came later, on every claim until the table was next
        -- analyzed: the status is written as those a claimable row cannot have, which no partial
        -- index matches, and seq scans are off in this function. (The CHECK on status in
        -- 001_baseline.sql allows five; a new status must be named here.)
        WHERE q.delivery_id = ANY (ARRAY(SELECT p.delivery_id FROM picked p))
          AND q.status NOT IN ('delivering', 'delivered', 'dead_letter')
        RETURNING q.*
    ), debited AS (
        -- Every endpoint looked at goes to the back of the line (when the line moves: p_line_moves),
        -- whether it got rows or was at its cap: otherwise endpoints that can take nothing would
        -- keep the front and crowd out the rest. Those that got rows pay their rate tokens, and an
        -- open circuit's sleep is over.
        UPDATE webhooks.webhook_health_metrics h
        SET rate_tokens = CASE WHEN n.claimed IS NULL THEN h.rate_tokens
                               WHEN qt.rate IS NOT NULL THEN qt.tokens_now - n.claimed END,
            rate_refilled_at = CASE WHEN n.claimed IS NULL THEN h.rate_refilled_at
                                    WHEN qt.rate IS NOT NULL THEN clock.now_exact END,
            circuit_state = CASE WHEN h.circuit_state = 'open' AND n.claimed IS NOT NULL THEN 'half_open'
                                 ELSE h.circuit_state END,
            probe_successes = CASE WHEN h.circuit_state = 'open' AND n.claimed IS NOT NULL THEN 0
                                   ELSE h.probe_successes END,
            probe_failures = CASE WHEN h.circuit_state = 'open' AND n.claimed IS NOT NULL THEN 0
                                  ELSE h.probe_failures END,
            last_claimed_at = CASE WHEN p_line_moves THEN clock.now_exact ELSE h.last_claimed_at END,
            updated_at = CASE WHEN n.claimed IS NULL THEN h.updated_at ELSE now() END
        -- tokens are per request: a digest costs one
        FROM quota qt
        LEFT JOIN (SELECT c.webhook_id, count(DISTINCT coalesce(c.digest_id, -c.delivery_id))::integer AS claimed
                   FROM claimed c GROUP BY c.webhook_id) n ON n.webhook_id = qt.webhook_id
        CROSS JOIN clock
        WHERE h.webhook_id = qt.webhook_id AND (n.claimed IS NOT NULL OR p_line_moves)
        RETURNING h.webhook_id, n.claimed IS NOT NULL AS claimed_any
    ), tenants_debited AS (
        UPDATE webhooks.tenants t
        SET rate_tokens = tq.tokens_now - n.claimed, rate_refilled_at = clock.now_exact
        FROM (SELECT c.tenant_id, count(DISTINCT coalesce(c.digest_id, -c.delivery_id))::integer AS claimed
              FROM claimed c GROUP BY c.tenant_id) n
        JOIN tenant_quota tq ON tq.tenant_id = n.tenant_id
        CROSS JOIN clock
        WHERE t.id = n.tenant_id AND tq.rate IS NOT NULL
        RETURNING 1
    ), half_opened AS (
        INSERT INTO webhooks.endpoint_events (webhook_id, change, reason, decided_by)
        SELECT d.webhook_id, 'circuit_half_open', 'sleep over; sending probes', 'circuit breaker'
        FROM debited d JOIN quota qt ON qt.webhook_id = d.webhook_id
        WHERE qt.circuit_state = 'open' AND d.claimed_any
        RETURNING 1
    ), claimed_tenants AS MATERIALIZED (
        -- The rank is counted once per tenant of the batch: inlined into the join below, it was
        -- counted once per row, over up to 10000 index entries each for a tenant of a high id.
        SELECT t.id, t.name, webhooks.tenant_rank(t.id) AS rank, t.allow_networks
        FROM webhooks.tenants t
        WHERE t.id = ANY (ARRAY(SELECT DISTINCT c.tenant_id FROM claimed c))
    )
    SELECT q.delivery_id, q.webhook_id, q.event_id, q.idempotency_key, q.event_type,
           coalesce(m.payload, q.payload)::text, q.attempts,
           coalesce(q.max_attempts, e.max_attempts, cfg.max_attempts),
           q.deferrals, q.replays, q.lease_token, q.locked_until, q.traceparent,
           e.url, e.signing_secrets, e.headers, e.body_format, e.secret_settings, e.timeout_ms,
           coalesce(e.retry_schedule, cfg.retry_schedule), cfg.retry_jitter, q.created_at,
           cfg.retry_policy || e.retry_policy, q.digest_id, ct.name, ct.rank,
           ct.allow_networks
    FROM claimed q
    -- the payload is the message's (a row inserted with the triggers off keeps its own)
    LEFT JOIN webhooks.messages m ON m.message_id = q.message_id
    JOIN webhooks.endpoints e ON e.id = q.webhook_id
    JOIN claimed_tenants ct ON ct.id = q.tenant_id
    CROSS JOIN cfg
    ORDER BY q.priority DESC, q.delivery_id;
END;
$$;
REVOKE EXECUTE ON FUNCTION webhooks.claim_from_endpoints(text, integer, integer, bigint[], bigint[], boolean)
    FROM PUBLIC;

CREATE OR REPLACE FUNCTION webhooks.acquire(p_worker_id text, p_batch_size integer, p_lease_seconds integer,
                                            p_tenants text[] DEFAULT NULL, p_exclude_tenants text[] DEFAULT NULL)
-- (the row's columns: the type webhooks.claimed_delivery, migrations/021)
RETURNS SETOF webhooks.claimed_delivery
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
-- Planned once per session, not on every call: the custom plans PostgreSQL chose otherwise cost
-- 1.7-2 ms of planning per claim, four times the claim itself when one row is due. Every
-- statement here and in its steps reaches rows through an index whatever the estimates (see
-- `claimed`); the two clean-ups it calls keep their own plan_cache_mode (below). A plan is kept
-- until a table it reads is next analyzed, so it must also hold for a queue far larger than the
-- one it was made for: a seq scan never does. (Seq scans are off in what it calls too, triggers
-- included: each of their statements has its index.)
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    v_locked record;
BEGIN
    -- Bounds: a lease beyond an hour keeps a crashed worker's rows for that long, and a claim
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
    v_locked := webhooks.lock_claimable_endpoints(p_batch_size, p_tenants, p_exclude_tenants);
    IF v_locked.endpoints IS NULL THEN
        RETURN;
    END IF;
    IF webhooks.is_one_plain_endpoint(v_locked.endpoints) THEN
        RETURN QUERY SELECT * FROM webhooks.claim_from_one_endpoint(
            p_worker_id, p_batch_size, p_lease_seconds, v_locked.endpoints, v_locked.line_moves);
    ELSE
        RETURN QUERY SELECT * FROM webhooks.claim_from_endpoints(
            p_worker_id, p_batch_size, p_lease_seconds, v_locked.endpoints,
            webhooks.lock_limited_tenants(v_locked.endpoints), v_locked.line_moves);
    END IF;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.acquire(text, integer, integer, text[], text[]) TO webhooks_worker;

-- p_tenants / p_exclude_tenants: the worker's pool, as acquire() takes them (a pool must not wake for
-- rows it may not claim).
CREATE OR REPLACE FUNCTION webhooks.next_due_in(p_tenants text[] DEFAULT NULL,
                                                p_exclude_tenants text[] DEFAULT NULL)
RETURNS double precision
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_at timestamptz;
BEGIN
    v_at := (
    WITH cfg AS (
        SELECT * FROM webhooks.delivery_config
    ), per_endpoint AS (
        SELECT greatest(
                   due.at,
                   h.paused_until,
                   CASE WHEN h.circuit_state = 'open' THEN h.circuit_open_until END,
                   CASE WHEN r.rate IS NOT NULL AND coalesce(h.rate_tokens, 1) < 1
                        THEN h.rate_refilled_at + make_interval(secs => (1 - h.rate_tokens) / r.rate) END,
                   -- the tenant's rate limit, as the endpoint's
                   CASE WHEN t.rate_limit_per_second IS NOT NULL AND coalesce(t.rate_tokens, 1) < 1
                        THEN t.rate_refilled_at + make_interval(
                            secs => (1 - t.rate_tokens) / t.rate_limit_per_second::double precision) END
               ) AS at
        FROM webhooks.webhook_health_metrics h
        JOIN webhooks.endpoints e ON e.id = h.webhook_id
        JOIN webhooks.tenants t ON t.id = e.tenant_id
        CROSS JOIN cfg
        CROSS JOIN LATERAL (SELECT coalesce(e.rate_limit_per_second, cfg.rate_limit_per_second)::double precision
                            AS rate) r
        CROSS JOIN LATERAL (
            SELECT min(q.next_retry_at) AS at
            FROM webhooks.claimable q
            WHERE q.webhook_id = h.webhook_id
        ) due
        CROSS JOIN LATERAL (
            -- requests, as acquire() counts them: a digest in flight is one
            SELECT count(DISTINCT coalesce(d.digest_id, -d.delivery_id)) AS flying
            FROM webhooks.alert_delivery_queue d
            WHERE d.webhook_id = h.webhook_id AND d.status = 'delivering' AND d.locked_until > now()
        ) f
        WHERE e.active AND h.circuit_state <> 'forced_open' AND due.at IS NOT NULL
          AND (p_tenants IS NULL OR t.name = ANY (p_tenants))
          AND (p_exclude_tenants IS NULL OR NOT t.name = ANY (p_exclude_tenants))
          -- a tenant at its cap is woken by the finish that frees a place, as an endpoint is
          AND (t.max_in_flight IS NULL OR (
              SELECT count(DISTINCT coalesce(d.digest_id, -d.delivery_id)) FROM webhooks.alert_delivery_queue d
              WHERE d.tenant_id = t.id AND d.status = 'delivering' AND d.locked_until > now())
              < t.max_in_flight)
          -- an endpoint at its cap (or out of probes) is woken by the finish that frees a place
          AND f.flying < coalesce(e.max_in_flight, cfg.max_in_flight)
          AND NOT (h.circuit_state = 'half_open' AND f.flying + h.probe_successes + h.probe_failures
                   >= coalesce((e.circuit_policy ->> 'probes')::integer, cfg.circuit_probes))
    )
    SELECT least(
        (SELECT min(at) FROM per_endpoint),
        (SELECT min(locked_until) FROM webhooks.alert_delivery_queue WHERE status = 'delivering')));
    IF v_at IS NULL THEN
        RETURN NULL;  -- nothing waits: sleep until NOTIFY or the polling interval
    END IF;
    RETURN greatest(0, extract(epoch FROM v_at - now()))::double precision;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.next_due_in(text[], text[]) TO webhooks_worker;

CREATE OR REPLACE FUNCTION webhooks.release(p_worker_id text, p_leases jsonb) RETURNS integer
LANGUAGE sql
-- Short OLTP statements: JIT compilation would cost far more than it saves.
SET jit = off
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    WITH l AS (
        SELECT (x ->> 'delivery_id')::bigint AS delivery_id, (x ->> 'lease_token')::uuid AS lease_token
        FROM jsonb_array_elements(p_leases) x
    ), released AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = CASE WHEN q.attempts <= 1 AND q.failure_category IS NULL
                          THEN 'pending' ELSE 'retrying' END,
            attempts = q.attempts - 1,
            -- its place in the queue, as a lost worker's row keeps it (end_leases)
            next_retry_at = least(q.next_retry_at, now()),
            locked_by = NULL, lease_token = NULL, locked_until = NULL,
            updated_at = now()
        FROM l
        WHERE q.delivery_id = l.delivery_id AND q.status = 'delivering'
          AND q.lease_token = l.lease_token
        RETURNING q.delivery_id, q.webhook_id, q.attempts + 1 AS attempt, l.lease_token
    ), logged AS (
        INSERT INTO webhooks.alert_delivery_log
            (delivery_id, webhook_id, attempt, outcome, error, worker_id, lease_token)
        SELECT delivery_id, webhook_id, attempt, 'released', 'released at shutdown; attempt not counted',
               p_worker_id, lease_token
        FROM released
        RETURNING 1
    )
    SELECT count(*)::integer FROM logged;
$$;
GRANT EXECUTE ON FUNCTION webhooks.release(text, jsonb) TO webhooks_worker;
