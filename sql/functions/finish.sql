-- finish: webhooks.finish(), the outcome write for a batch of attempts, in one transaction, and the
-- endpoint state it updates (health, the circuit breaker, pauses, disabling).
--
-- p_outcomes is a JSON array, one object per attempt (webhooks.attempt_outcome names the fields,
-- and reports_request, false for the members of a digest but one).
-- The worker decides what an HTTP result means (classification and backoff are pure Python); this
-- function applies it under the fencing rule: a row changes only if it is still held under the
-- same lease token. A late outcome (its lease was taken over) leaves the row alone but is still
-- logged, marked stale, so the history is complete. The same batch sent again (its commit was made
-- but a crash or a cut connection lost the answer) is answered as it was, applied, and is neither
-- logged nor counted twice. Whether attempts are exhausted is decided here,
-- from the row, the endpoint and webhooks.delivery_config. A deferral (Retry-After on 429/503) gives
-- the attempt back, up to max_deferrals; past that it counts as an attempt, and it pauses the whole
-- endpoint until then. An attempt refused by the worker's destination rules ('blocked') or cut off
-- by its shutdown ('interrupted') leaves the endpoint's health and circuit alone: the receiver said
-- nothing. Endpoint state is then updated once per endpoint, in endpoint-id order, so concurrent
-- batches never deadlock.
--
-- The circuit counts availability failures only (5xx, 408, 429, timeouts, connection, DNS, TLS):
-- it opens when at least failure_ratio of the attempts in the last window_seconds failed, with at
-- least min_attempts of them; while open nothing is claimed; after sleep_seconds up to `probes`
-- requests go through (half-open); at least probe_success_ratio of them succeeding closes it,
-- otherwise it reopens with the sleep doubled, up to max_sleep_seconds.

CREATE OR REPLACE FUNCTION webhooks.availability_failure(p_failure_category text, p_http_status integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(p_failure_category IN ('timeout', 'connect', 'dns', 'tls', 'protocol', 'http_5xx',
                                           'rate_limited'),
                    false)
        OR coalesce(p_http_status IN (408, 429) OR p_http_status >= 500, false);
$$;

CREATE OR REPLACE FUNCTION webhooks.health_status(consecutive_failures bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN consecutive_failures = 0 THEN 'healthy'
                WHEN consecutive_failures < 5 THEN 'degraded'
                ELSE 'failing' END;
$$;

-- One batch's outcomes for its endpoints (p_endpoints: one JSON object per endpoint, as finish()
-- sums them): counters, the circuit's window and transitions, a pause asked for by Retry-After,
-- and disabling (410 Gone, or no success for disable_after). Every endpoint's state row is
-- locked first, in endpoint-id order (so concurrent batches never deadlock), then updated by one
-- statement for all of them; only the endpoints whose state changed (a circuit transition, a
-- dead-letter notice, disabling) take a step of their own, to log the event. Returns the state
-- change per endpoint, worded for a log line (none: no row). One statement, not one call per
-- endpoint: a finish over many endpoints spent half its time in those calls.
--
-- The usual batch takes a short statement first: on an endpoint whose attempts in the batch were
-- all delivered, whose circuit is closed with no failure in its window, that is not failing and
-- has no dead-letter notice due, nothing but the counters and the window can change (no
-- transition, pause, notice or disabling), so that statement writes just those. The full
-- statement then takes the endpoints it left, if any. Why: the full statement cost a batch of one
-- endpoint about 1 ms, most of it starting its plan, a fifth of a 100-row finish. The setting
-- webhooks.finish_path = 'full' sends every endpoint the long way (the tests compare the two).
CREATE OR REPLACE FUNCTION webhooks.record_endpoint_outcomes(p_decided_by text, p_endpoints jsonb)
RETURNS TABLE (webhook_id bigint, last_delivery_id bigint, gone_delivery_id bigint, change text)
LANGUAGE plpgsql
SET jit = off
-- Planned once per session: a custom plan of the statement below took 4-5 ms to make, ten times
-- its execution for a batch of one endpoint. Its rows are reached by primary key whatever the
-- estimates (finish() turns seq scans off).
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_changed jsonb;
    s record;
    v_change text;
    v_short bigint[];
BEGIN
    -- every endpoint has this row from its registration on (trigger create_health_row)
    PERFORM 1 FROM webhooks.webhook_health_metrics h
    WHERE h.webhook_id = ANY (ARRAY(SELECT (x ->> 'webhook_id')::bigint FROM jsonb_array_elements(p_endpoints) x))
    ORDER BY h.webhook_id
    FOR UPDATE;

    IF current_setting('webhooks.finish_path', true) IS DISTINCT FROM 'full' THEN
        -- Each column as the full statement below writes it for such an endpoint: no failure in
        -- the window stays none whether it rolls or not, consecutive failures end at 0, failing_since
        -- stays NULL, the circuit closed, dead_letters_since_notice as it was.
        WITH x AS (
            SELECT * FROM jsonb_to_recordset(p_endpoints) AS x(
                webhook_id bigint, attempts integer, successes integer, latency_ms bigint,
                last_http_status integer, pause_seconds double precision, gone_delivery_id bigint,
                dead_letters integer)
        ), short AS (
            UPDATE webhooks.webhook_health_metrics h SET
                total_attempts = h.total_attempts + x.attempts,
                successes = h.successes + x.successes,
                total_latency_ms = h.total_latency_ms + x.latency_ms,
                consecutive_failures = 0,
                last_http_status = coalesce(x.last_http_status, h.last_http_status),
                last_success_at = now(),
                -- the window as `windowed` below moves it (reset after two widths, else rolled)
                window_started_at = CASE WHEN h.window_started_at IS NULL
                                              OR now() >= h.window_started_at + 2 * w.width THEN now()
                                         WHEN now() >= h.window_started_at + w.width
                                              THEN h.window_started_at + w.width
                                         ELSE h.window_started_at END,
                previous_attempts = CASE WHEN h.window_started_at IS NULL
                                              OR now() >= h.window_started_at + 2 * w.width THEN 0
                                         WHEN now() >= h.window_started_at + w.width THEN h.window_attempts
                                         ELSE h.previous_attempts END,
                window_attempts = CASE WHEN h.window_started_at IS NULL
                                            OR now() >= h.window_started_at + w.width THEN 0
                                       ELSE h.window_attempts END + x.attempts,
                health_status = CASE WHEN e.active THEN webhooks.health_status(0) ELSE 'disabled' END,
                updated_at = now()
            FROM x
            JOIN webhooks.endpoints e ON e.id = x.webhook_id
            CROSS JOIN (SELECT * FROM webhooks.delivery_config LIMIT 1) c
            CROSS JOIN LATERAL (
                SELECT make_interval(secs => coalesce((e.circuit_policy ->> 'window_seconds')::integer,
                                                      c.circuit_window_seconds)) AS width
            ) w
            WHERE h.webhook_id = x.webhook_id
              AND x.successes = x.attempts AND x.pause_seconds IS NULL AND x.gone_delivery_id IS NULL
              AND x.dead_letters = 0
              AND h.circuit_state = 'closed' AND h.window_failures = 0 AND h.previous_failures = 0
              AND h.failing_since IS NULL AND h.dead_letters_since_notice < c.dead_letter_alert_threshold
            RETURNING h.webhook_id
        )
        SELECT array_agg(short.webhook_id) INTO v_short FROM short;
        IF v_short IS NOT NULL THEN
            RAISE DEBUG 'finish: the short health update, endpoints %', v_short;
            IF cardinality(v_short) = jsonb_array_length(p_endpoints) THEN
                RETURN;
            END IF;
            p_endpoints := (SELECT jsonb_agg(x) FROM jsonb_array_elements(p_endpoints) x
                            WHERE NOT (x ->> 'webhook_id')::bigint = ANY (v_short));
        END IF;
    END IF;

    WITH x AS (
            SELECT * FROM jsonb_to_recordset(p_endpoints) AS x(
                webhook_id bigint, attempts integer, successes integer, availability_failures integer,
                trailing_failures integer, latency_ms bigint, last_http_status integer,
                last_failure_category text, pause_seconds double precision, gone_delivery_id bigint,
                last_delivery_id bigint, last_attempt integer, dead_letters integer)
        ), policy AS (
            -- the endpoint's circuit_policy over delivery_config
            SELECT x.*, e.active, c.disable_after, c.dead_letter_alert_threshold,
                   x.attempts - x.successes AS failures,
                   coalesce((e.circuit_policy ->> 'failure_ratio')::real, c.circuit_failure_ratio) AS failure_ratio,
                   coalesce((e.circuit_policy ->> 'window_seconds')::integer, c.circuit_window_seconds)
                       AS window_seconds,
                   coalesce((e.circuit_policy ->> 'min_attempts')::integer, c.circuit_min_attempts) AS min_attempts,
                   coalesce((e.circuit_policy ->> 'sleep_seconds')::integer, c.circuit_sleep_seconds)
                       AS sleep_seconds,
                   coalesce((e.circuit_policy ->> 'max_sleep_seconds')::integer, c.circuit_max_sleep_seconds)
                       AS max_sleep_seconds,
                   coalesce((e.circuit_policy ->> 'probes')::integer, c.circuit_probes) AS probes,
                   coalesce((e.circuit_policy ->> 'probe_success_ratio')::real, c.circuit_probe_success_ratio)
                       AS probe_success_ratio
            FROM x
            JOIN webhooks.endpoints e ON e.id = x.webhook_id
            CROSS JOIN (SELECT * FROM webhooks.delivery_config LIMIT 1) c
        ), windowed AS (
            -- The sliding window: the current fixed window plus the previous one weighted by overlap.
            SELECT p.*, h.circuit_state AS old_state, h.circuit_sleep_seconds AS old_sleep,
                   h.consecutive_failures AS old_consecutive, h.failing_since AS old_failing_since,
                   h.dead_letters_since_notice + coalesce(p.dead_letters, 0) AS dead_letters_now,
                   h.probe_successes + (p.attempts - p.availability_failures) AS probe_successes_now,
                   h.probe_failures + p.availability_failures AS probe_failures_now,
                   w.started_at, w.rolled,
                   CASE WHEN w.reset THEN 0 WHEN w.rolled THEN h.window_attempts ELSE h.previous_attempts END
                       AS previous_attempts,
                   CASE WHEN w.reset THEN 0 WHEN w.rolled THEN h.window_failures ELSE h.previous_failures END
                       AS previous_failures,
                   CASE WHEN w.reset OR w.rolled THEN 0 ELSE h.window_attempts END + p.attempts AS window_attempts,
                   CASE WHEN w.reset OR w.rolled THEN 0 ELSE h.window_failures END + p.availability_failures
                       AS window_failures
            FROM policy p
            JOIN webhooks.webhook_health_metrics h ON h.webhook_id = p.webhook_id
            CROSS JOIN LATERAL (
                SELECT r.reset, NOT r.reset AND now() >= h.window_started_at + r.width AS rolled,
                       CASE WHEN r.reset THEN now()
                            WHEN now() >= h.window_started_at + r.width THEN h.window_started_at + r.width
                            ELSE h.window_started_at END AS started_at
                FROM (SELECT make_interval(secs => p.window_seconds) AS width,
                             h.window_started_at IS NULL
                             OR now() >= h.window_started_at + 2 * make_interval(secs => p.window_seconds) AS reset) r
            ) w
        ), estimated AS (
            SELECT w.*,
                   w.window_attempts + w.previous_attempts * v.weight AS est_attempts,
                   w.window_failures + w.previous_failures * v.weight AS est_failures,
                   -- the ratios as the decimals they were set as: a real widened to double
                   -- precision is not (0.6 becomes 0.6000000238), so 3 of 5 probes, or 12 failures
                   -- of 20 attempts, fell just short of a ratio of 0.6
                   ceil(w.probe_success_ratio::numeric * w.probes) AS probes_needed
            FROM windowed w
            CROSS JOIN LATERAL (SELECT greatest(0, 1 - extract(epoch FROM now() - w.started_at)
                                                   / w.window_seconds)::double precision AS weight) v
        ), decided AS (
            SELECT t.*,
                   CASE WHEN t.opens THEN t.sleep_seconds
                        WHEN t.reopens THEN least(coalesce(t.old_sleep, t.sleep_seconds) * 2, t.max_sleep_seconds)
                   END AS sleep,
                   CASE WHEN t.opens THEN format('circuit_opened: %s of %s attempts failed in the last %s s',
                                                 round(t.est_failures::numeric), round(t.est_attempts::numeric),
                                                 t.window_seconds)
                        WHEN t.closes THEN format('circuit_closed: %s of %s probes succeeded',
                                                  t.probe_successes_now,
                                                  t.probe_successes_now + t.probe_failures_now)
                        WHEN t.reopens THEN format('circuit_opened: %s of %s probes failed', t.probe_failures_now,
                                                   t.probe_successes_now + t.probe_failures_now)
                   END AS circuit_change,
                   CASE WHEN t.successes > 0 THEN t.trailing_failures
                        ELSE t.old_consecutive + t.failures END AS consecutive_now,
                   CASE WHEN t.trailing_failures = 0 AND t.successes > 0 THEN NULL
                        WHEN t.failures > 0 AND t.old_failing_since IS NULL THEN now()
                        ELSE t.old_failing_since END AS failing_since_now
            FROM (
                SELECT e.*,
                       e.old_state = 'closed' AND e.est_attempts >= e.min_attempts
                           AND e.est_failures::numeric >= e.failure_ratio::numeric * e.est_attempts::numeric
                           AS opens,
                       e.old_state = 'half_open' AND e.probe_successes_now >= e.probes_needed AS closes,
                       e.old_state = 'half_open' AND e.probe_successes_now < e.probes_needed
                           AND e.probe_failures_now > e.probes - e.probes_needed AS reopens
                FROM estimated e
            ) t
        ), updated AS (
            UPDATE webhooks.webhook_health_metrics h SET
                total_attempts = h.total_attempts + d.attempts,
                successes = h.successes + d.successes,
                failures = h.failures + d.failures,
                total_latency_ms = h.total_latency_ms + d.latency_ms,
                consecutive_failures = d.consecutive_now,
                last_http_status = coalesce(d.last_http_status, h.last_http_status),
                last_failure_category = coalesce(d.last_failure_category, h.last_failure_category),
                last_success_at = CASE WHEN d.successes > 0 THEN now() ELSE h.last_success_at END,
                last_failure_at = CASE WHEN d.failures > 0 THEN now() ELSE h.last_failure_at END,
                failing_since = d.failing_since_now,
                window_started_at = d.started_at,
                window_attempts = CASE WHEN d.closes THEN 0 ELSE d.window_attempts END,
                window_failures = CASE WHEN d.closes THEN 0 ELSE d.window_failures END,
                previous_attempts = CASE WHEN d.closes THEN 0 ELSE d.previous_attempts END,
                previous_failures = CASE WHEN d.closes THEN 0 ELSE d.previous_failures END,
                circuit_state = CASE WHEN d.sleep IS NOT NULL THEN 'open'
                                     WHEN d.closes THEN 'closed' ELSE h.circuit_state END,
                circuit_opened_at = CASE WHEN d.sleep IS NOT NULL THEN now() ELSE h.circuit_opened_at END,
                circuit_open_until = CASE WHEN d.sleep IS NOT NULL THEN now() + make_interval(secs => d.sleep)
                                          WHEN d.closes THEN NULL ELSE h.circuit_open_until END,
                circuit_sleep_seconds = CASE WHEN d.sleep IS NOT NULL THEN d.sleep
                                             WHEN d.closes THEN NULL ELSE h.circuit_sleep_seconds END,
                probe_successes = CASE WHEN d.sleep IS NOT NULL THEN 0
                                       WHEN d.old_state = 'half_open' THEN d.probe_successes_now
                                       ELSE h.probe_successes END,
                probe_failures = CASE WHEN d.sleep IS NOT NULL THEN 0
                                      WHEN d.old_state = 'half_open' THEN d.probe_failures_now
                                      ELSE h.probe_failures END,
                paused_until = CASE WHEN d.pause_seconds > 0
                                    THEN greatest(h.paused_until, now() + make_interval(secs => d.pause_seconds))
                                    ELSE h.paused_until END,
                health_status = CASE WHEN d.active THEN webhooks.health_status(d.consecutive_now)
                                     ELSE 'disabled' END,
                dead_letters_since_notice = CASE WHEN d.dead_letters_now >= d.dead_letter_alert_threshold THEN 0
                                                 ELSE d.dead_letters_now END,
                updated_at = now()
            FROM decided d
            WHERE h.webhook_id = d.webhook_id
            RETURNING d.webhook_id, d.last_delivery_id, d.last_attempt, d.gone_delivery_id, d.circuit_change,
                      CASE WHEN d.dead_letters_now >= d.dead_letter_alert_threshold THEN d.dead_letters_now END
                          AS dead_letter_notice,
                      d.failing_since_now < now() - d.disable_after AS failing_too_long, d.failing_since_now
        )
        SELECT jsonb_agg(to_jsonb(u) ORDER BY u.webhook_id) INTO v_changed
        FROM updated u
        WHERE u.circuit_change IS NOT NULL OR u.dead_letter_notice IS NOT NULL
           OR u.gone_delivery_id IS NOT NULL OR u.failing_too_long;

    -- (a loop over the statement itself cannot be: a cursor may not hold an UPDATE)
    FOR s IN
        SELECT * FROM jsonb_to_recordset(coalesce(v_changed, '[]')) AS c(
            webhook_id bigint, last_delivery_id bigint, last_attempt integer, gone_delivery_id bigint,
            circuit_change text, dead_letter_notice integer, failing_too_long boolean,
            failing_since_now timestamptz)
        ORDER BY c.webhook_id
    LOOP
        v_change := NULL;
        IF s.circuit_change IS NOT NULL THEN
            v_change := webhooks.record_endpoint_event(
                s.webhook_id, split_part(s.circuit_change, ': ', 1), split_part(s.circuit_change, ': ', 2),
                'circuit breaker', s.last_delivery_id, s.last_attempt);
        END IF;
        IF s.dead_letter_notice IS NOT NULL THEN
            v_change := concat_ws('; ', v_change, webhooks.record_endpoint_event(
                s.webhook_id, 'dead_letters', s.dead_letter_notice || ' new dead letters',
                p_decided_by, s.last_delivery_id, s.last_attempt));
        END IF;
        IF s.gone_delivery_id IS NOT NULL THEN
            v_change := concat_ws('; ', v_change, webhooks.disable_endpoint(
                s.webhook_id, 'HTTP 410 Gone on delivery ' || s.gone_delivery_id, p_decided_by,
                s.gone_delivery_id, NULL));
        ELSIF s.failing_too_long THEN
            v_change := concat_ws('; ', v_change, webhooks.disable_endpoint(
                s.webhook_id, 'no successful delivery since ' || s.failing_since_now, p_decided_by,
                s.last_delivery_id, s.last_attempt));
        END IF;
        webhook_id := s.webhook_id;
        last_delivery_id := s.last_delivery_id;
        gone_delivery_id := s.gone_delivery_id;
        change := v_change;
        RETURN NEXT;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION webhooks.finish(p_worker_id text, p_outcomes jsonb)
RETURNS TABLE (delivery_id bigint, applied boolean, status text, endpoint_change text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
-- Its plans are kept until a table they read is next analyzed, so they must hold for a queue far
-- larger than the one they were made for: made while it was nearly empty, they read the whole
-- queue for every batch once a backlog came (a seq scan looks cheapest on a small table). (Seq
-- scans are off in what it calls too: record_endpoint_outcomes reads its rows by primary key.)
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_delivery_ids bigint[];
    v_applied boolean[];
    v_statuses text[];
    v_endpoints jsonb;
    v_changes jsonb := '{}';
BEGIN
    WITH o AS (
        SELECT r.*, item.ord,
               -- false for the members of a digest but the one that reports its request
               coalesce((item.value ->> 'reports_request')::boolean, true) AS reports_request
        FROM jsonb_array_elements(p_outcomes) WITH ORDINALITY AS item(value, ord),
             jsonb_populate_record(NULL::webhooks.attempt_outcome, item.value) AS r
    ), cfg AS (
        -- (the one row: LIMIT 1 tells the planner so. Left to guess, it took the never-analyzed
        -- table for 320 rows, every row of `target` for 320, and sized the hash tables below for
        -- tens of thousands of rows; clearing them was half of a one-outcome finish.)
        SELECT max_attempts, max_deferrals FROM webhooks.delivery_config LIMIT 1
    ), target AS (
        -- the rows as they were, with the decision each outcome leads to
        SELECT o.*, q.webhook_id, e.tenant_id, q.digest_id, q.lease_token AS held_token,
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
        -- (by primary key whatever the estimates, as in `applied`: a plan made on a small queue
        -- hashed it whole)
        WHERE q.delivery_id = ANY (ARRAY(SELECT o2.delivery_id FROM o o2))
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
    ), written_before AS (
        -- Outcomes this worker already wrote under the same lease: a retry of a batch whose commit
        -- the database made but whose answer a crash or a cut connection lost. They are answered as
        -- applied, with what was written then, and neither logged nor counted again.
        SELECT t.delivery_id,
               CASE l.outcome WHEN 'delivered' THEN 'delivered' WHEN 'dead_letter' THEN 'dead_letter'
                              ELSE 'retrying' END AS status
        FROM target t
        JOIN LATERAL (
            SELECT l.outcome FROM webhooks.alert_delivery_log l
            WHERE l.delivery_id = t.delivery_id AND l.lease_token = t.lease_token
              AND l.worker_id = p_worker_id AND NOT l.stale
              AND l.outcome IN ('delivered', 'retry', 'deferred', 'dead_letter')
            LIMIT 1
        ) l ON true
        WHERE t.held_token IS DISTINCT FROM t.lease_token
    ), logged AS (
        -- with the endpoint's tenant, read above: fill_log_tenant would look it up again per row
        INSERT INTO webhooks.alert_delivery_log
            (delivery_id, webhook_id, tenant_id, attempt, outcome, failure_category, http_status, latency_ms,
             error, response_excerpt, worker_id, lease_token, stale, digest_id)
        SELECT t.delivery_id, t.webhook_id, t.tenant_id, t.attempt,
               CASE t.decision WHEN 'exhausted' THEN 'dead_letter' ELSE t.decision END,
               t.failure_category, t.http_status, t.latency_ms,
               CASE WHEN t.decision = 'exhausted'
                    THEN concat_ws(': ', 'attempts exhausted', t.error) ELSE t.error END,
               left(t.response_excerpt, 1024), p_worker_id, t.lease_token, a.delivery_id IS NULL,
               t.digest_id
        FROM target t
        LEFT JOIN applied a ON a.delivery_id = t.delivery_id
        WHERE t.delivery_id NOT IN (SELECT w.delivery_id FROM written_before w)
        RETURNING 1
    ), per_outcome AS (
        SELECT t.*,
               -- A deferral (429 or 503 with Retry-After) is back-pressure from a receiver that
               -- answered: the pause below holds its rows, the circuit must not open on it.
               t.outcome NOT IN ('delivered', 'deferred')
                   AND webhooks.availability_failure(t.failure_category, t.http_status) AS unavailable,
               t.ord > coalesce(max(t.ord) FILTER (WHERE t.outcome = 'delivered')
                                OVER (PARTITION BY t.webhook_id), 0) AS after_last_success
        FROM target t
        -- A refused destination, and a request cut off because its worker shut down (category
        -- 'interrupted'), say nothing about the receiver: keep them out of the endpoint's state, or
        -- a cut-off half-open probe would count as a success and could close the circuit.
        WHERE coalesce(t.failure_category, '') NOT IN ('blocked', 'interrupted')
          -- a digest is one request: the one member the worker names speaks for it, whichever
          -- finish batch each member's outcome is in
          AND t.reports_request
          AND t.delivery_id NOT IN (SELECT w.delivery_id FROM written_before w)
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
                 array_agg(a.delivery_id IS NOT NULL OR w.delivery_id IS NOT NULL ORDER BY o.ord) AS applied,
                 array_agg(coalesce(a.status, w.status, 'stale') ORDER BY o.ord) AS statuses
          FROM o LEFT JOIN applied a ON a.delivery_id = o.delivery_id
                 LEFT JOIN written_before w ON w.delivery_id = o.delivery_id) r;

    IF v_endpoints IS NOT NULL THEN
        SELECT coalesce(jsonb_object_agg(coalesce(r.gone_delivery_id, r.last_delivery_id)::text, r.change), '{}')
        INTO v_changes
        FROM webhooks.record_endpoint_outcomes('worker ' || p_worker_id, v_endpoints) r
        WHERE r.change IS NOT NULL;
    END IF;

    RETURN QUERY
    SELECT r.delivery_id, r.applied, r.status, v_changes ->> r.delivery_id::text
    FROM unnest(v_delivery_ids, v_applied, v_statuses) WITH ORDINALITY AS r(delivery_id, applied, status, ord)
    ORDER BY r.ord;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.finish(text, jsonb) TO webhooks_worker;
