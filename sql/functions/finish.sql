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

-- The circuit settings in force for one endpoint: its circuit_policy over delivery_config.
CREATE OR REPLACE FUNCTION webhooks.circuit_policy(p_webhook_id bigint)
RETURNS TABLE (failure_ratio real, window_seconds integer, min_attempts integer, sleep_seconds integer,
               max_sleep_seconds integer, probes integer, probe_success_ratio real)
LANGUAGE sql STABLE AS $$
    SELECT coalesce((e.circuit_policy ->> 'failure_ratio')::real, c.circuit_failure_ratio),
           coalesce((e.circuit_policy ->> 'window_seconds')::integer, c.circuit_window_seconds),
           coalesce((e.circuit_policy ->> 'min_attempts')::integer, c.circuit_min_attempts),
           coalesce((e.circuit_policy ->> 'sleep_seconds')::integer, c.circuit_sleep_seconds),
           coalesce((e.circuit_policy ->> 'max_sleep_seconds')::integer, c.circuit_max_sleep_seconds),
           coalesce((e.circuit_policy ->> 'probes')::integer, c.circuit_probes),
           coalesce((e.circuit_policy ->> 'probe_success_ratio')::real, c.circuit_probe_success_ratio)
    FROM webhooks.endpoints e CROSS JOIN webhooks.delivery_config c
    WHERE e.id = p_webhook_id;
$$;

-- One batch's outcomes for one endpoint: counters, the circuit's window and transitions, a pause
-- asked for by Retry-After, and disabling (410 Gone, or no success for disable_after). Called by
-- webhooks.finish() once per endpoint per batch, in endpoint-id order. Returns the state change
-- it made, if any, worded for a log line.
CREATE OR REPLACE FUNCTION webhooks.record_endpoint_outcomes(
    p_webhook_id            bigint,
    p_decided_by            text,
    p_attempts              integer,
    p_successes             integer,
    p_availability_failures integer,
    p_trailing_failures     integer,
    p_latency_ms            bigint,
    p_last_http_status      integer,
    p_last_failure_category text,
    p_pause_seconds         double precision,
    p_gone_delivery_id      bigint,
    p_last_delivery_id      bigint,
    p_last_attempt          integer,
    p_dead_letters          integer DEFAULT 0
) RETURNS text
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    h         webhooks.webhook_health_metrics;
    policy    record;
    v_failures integer := p_attempts - p_successes;
    v_window  interval;
    v_weight  double precision;
    v_est_attempts double precision;
    v_est_failures double precision;
    v_sleep   integer;
    v_change  text;
    v_dead_letter_notice integer;
    setting   record;
BEGIN
    SELECT * INTO policy FROM webhooks.circuit_policy(p_webhook_id);
    v_window := make_interval(secs => policy.window_seconds);
    SELECT e.active, c.disable_after, c.dead_letter_alert_threshold INTO setting
    FROM webhooks.endpoints e CROSS JOIN webhooks.delivery_config c WHERE e.id = p_webhook_id;

    -- every endpoint has this row from its registration on (trigger create_health_row)
    SELECT * INTO h FROM webhooks.webhook_health_metrics WHERE webhook_id = p_webhook_id FOR UPDATE;

    h.total_attempts := h.total_attempts + p_attempts;
    h.successes := h.successes + p_successes;
    h.failures := h.failures + v_failures;
    h.total_latency_ms := h.total_latency_ms + p_latency_ms;
    h.consecutive_failures := CASE WHEN p_successes > 0 THEN p_trailing_failures
                                   ELSE h.consecutive_failures + v_failures END;
    h.last_http_status := coalesce(p_last_http_status, h.last_http_status);
    h.last_failure_category := coalesce(p_last_failure_category, h.last_failure_category);
    IF p_successes > 0 THEN
        h.last_success_at := now();
    END IF;
    IF v_failures > 0 THEN
        h.last_failure_at := now();
    END IF;
    IF p_trailing_failures = 0 AND p_successes > 0 THEN
        h.failing_since := NULL;
    ELSIF v_failures > 0 AND h.failing_since IS NULL THEN
        h.failing_since := now();
    END IF;

    -- The sliding window: the current fixed window plus the previous one weighted by overlap.
    IF h.window_started_at IS NULL OR now() >= h.window_started_at + 2 * v_window THEN
        h.previous_attempts := 0;
        h.previous_failures := 0;
        h.window_attempts := 0;
        h.window_failures := 0;
        h.window_started_at := now();
    ELSIF now() >= h.window_started_at + v_window THEN
        h.previous_attempts := h.window_attempts;
        h.previous_failures := h.window_failures;
        h.window_attempts := 0;
        h.window_failures := 0;
        h.window_started_at := h.window_started_at + v_window;
    END IF;
    h.window_attempts := h.window_attempts + p_attempts;
    h.window_failures := h.window_failures + p_availability_failures;
    v_weight := greatest(0, 1 - extract(epoch FROM now() - h.window_started_at) / policy.window_seconds);
    v_est_attempts := h.window_attempts + h.previous_attempts * v_weight;
    v_est_failures := h.window_failures + h.previous_failures * v_weight;

    IF h.circuit_state = 'closed' AND v_est_attempts >= policy.min_attempts
            AND v_est_failures >= policy.failure_ratio * v_est_attempts THEN
        v_sleep := policy.sleep_seconds;
        v_change := format('circuit_opened: %s of %s attempts failed in the last %s s',
                           round(v_est_failures::numeric), round(v_est_attempts::numeric),
                           policy.window_seconds);
    ELSIF h.circuit_state = 'half_open' THEN
        h.probe_successes := h.probe_successes + (p_attempts - p_availability_failures);
        h.probe_failures := h.probe_failures + p_availability_failures;
        IF h.probe_successes >= ceil(policy.probe_success_ratio * policy.probes) THEN
            h.circuit_state := 'closed';
            h.circuit_open_until := NULL;
            h.circuit_sleep_seconds := NULL;
            h.window_attempts := 0;
            h.window_failures := 0;
            h.previous_attempts := 0;
            h.previous_failures := 0;
            v_change := format('circuit_closed: %s of %s probes succeeded',
                               h.probe_successes, h.probe_successes + h.probe_failures);
        ELSIF h.probe_failures > policy.probes - ceil(policy.probe_success_ratio * policy.probes) THEN
            -- too many probes failed for the rest to close it: reopen now, sleeping longer
            v_sleep := least(coalesce(h.circuit_sleep_seconds, policy.sleep_seconds) * 2,
                             policy.max_sleep_seconds);
            v_change := format('circuit_opened: %s of %s probes failed',
                               h.probe_failures, h.probe_successes + h.probe_failures);
        END IF;
    END IF;
    IF v_sleep IS NOT NULL THEN
        h.circuit_state := 'open';
        h.circuit_opened_at := now();
        h.circuit_open_until := now() + make_interval(secs => v_sleep);
        h.circuit_sleep_seconds := v_sleep;
        h.probe_successes := 0;
        h.probe_failures := 0;
    END IF;

    IF p_pause_seconds IS NOT NULL AND p_pause_seconds > 0 THEN
        h.paused_until := greatest(h.paused_until, now() + make_interval(secs => p_pause_seconds));
    END IF;
    h.health_status := CASE WHEN setting.active
                            THEN webhooks.health_status(h.consecutive_failures) ELSE 'disabled' END;
    h.dead_letters_since_notice := h.dead_letters_since_notice + coalesce(p_dead_letters, 0);
    IF h.dead_letters_since_notice >= setting.dead_letter_alert_threshold THEN
        v_dead_letter_notice := h.dead_letters_since_notice;
        h.dead_letters_since_notice := 0;
    END IF;

    UPDATE webhooks.webhook_health_metrics SET
        total_attempts = h.total_attempts, successes = h.successes, failures = h.failures,
        consecutive_failures = h.consecutive_failures, total_latency_ms = h.total_latency_ms,
        last_success_at = h.last_success_at, last_failure_at = h.last_failure_at,
        last_http_status = h.last_http_status, last_failure_category = h.last_failure_category,
        health_status = h.health_status, circuit_state = h.circuit_state,
        circuit_opened_at = h.circuit_opened_at, circuit_open_until = h.circuit_open_until,
        circuit_sleep_seconds = h.circuit_sleep_seconds, probe_successes = h.probe_successes, probe_failures = h.probe_failures,
        window_started_at = h.window_started_at, window_attempts = h.window_attempts,
        window_failures = h.window_failures, previous_attempts = h.previous_attempts,
        previous_failures = h.previous_failures, paused_until = h.paused_until,
        failing_since = h.failing_since, dead_letters_since_notice = h.dead_letters_since_notice,
        updated_at = now()
    WHERE webhook_id = p_webhook_id;

    IF v_change IS NOT NULL THEN
        v_change := webhooks.record_endpoint_event(
            p_webhook_id, split_part(v_change, ': ', 1), split_part(v_change, ': ', 2),
            'circuit breaker', p_last_delivery_id, p_last_attempt);
    END IF;

    IF v_dead_letter_notice IS NOT NULL THEN
        v_change := concat_ws('; ', v_change, webhooks.record_endpoint_event(
            p_webhook_id, 'dead_letters', v_dead_letter_notice || ' new dead letters',
            p_decided_by, p_last_delivery_id, p_last_attempt));
    END IF;
    IF p_gone_delivery_id IS NOT NULL THEN
        v_change := concat_ws('; ', v_change, webhooks.disable_endpoint(
            p_webhook_id, 'HTTP 410 Gone on delivery ' || p_gone_delivery_id, p_decided_by,
            p_gone_delivery_id, NULL));
    ELSIF h.failing_since IS NOT NULL AND h.failing_since < now() - setting.disable_after THEN
        v_change := concat_ws('; ', v_change, webhooks.disable_endpoint(
            p_webhook_id, 'no successful delivery since ' || h.failing_since, p_decided_by,
            p_last_delivery_id, p_last_attempt));
    END IF;
    RETURN v_change;
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
    s record;
    v_change text;
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
        SELECT o.*, q.webhook_id, q.digest_id, q.lease_token AS held_token,
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
GRANT EXECUTE ON FUNCTION webhooks.finish(text, jsonb) TO webhooks_worker;
