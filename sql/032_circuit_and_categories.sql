-- 032_circuit_and_categories: what counts against the circuit, and categories for every dead letter
-- (issue 17, items 4 and 7).
--
-- A 429 or 503 with Retry-After is a deferral: back-pressure from a healthy receiver, already
-- honoured by pausing the endpoint for that long. It counted as an availability failure, so 20
-- polite 429s opened the circuit and the rows waited out its sleep (33 s) instead of the 3 s asked
-- for. finish() no longer counts deferrals against the circuit. A 429 without Retry-After (a
-- retry, not a deferral) still counts.
--
-- availability_failure() also counts 'protocol', the category the worker gives a response it cannot
-- parse as HTTP (it used to be 'connect', which counted: a receiver answering garbage is as
-- unavailable as one that does not answer).
--
-- A request still open when a worker's shutdown grace ran out is recorded as an attempt (category
-- 'interrupted'), but the worker cut it off: finish() keeps it out of the endpoint's health and
-- circuit, as it keeps refused destinations ('blocked').
--
-- Rows dead-lettered because their endpoint stayed disabled past their retry window had no failure
-- category; they get 'disabled' (the reason stays 'endpoint disabled'), so `dlq list --category`
-- and replay_dead_letters(p_failure_category => ...) find them. Existing ones are given it here;
-- their last attempt's category, if any, stays in the audit log.
--
-- Functions restated whole from their latest definitions (finish 028, availability_failure and
-- expire_disabled_endpoint_rows 006), with the SECURITY DEFINER and SET clauses 022 gave them.

CREATE OR REPLACE FUNCTION webhooks.availability_failure(p_failure_category text, p_http_status integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(p_failure_category IN ('timeout', 'connect', 'dns', 'tls', 'protocol', 'http_5xx',
                                           'rate_limited'),
                    false)
        OR coalesce(p_http_status IN (408, 429) OR p_http_status >= 500, false);
$$;

-- Disabled endpoints' rows wait; once a row's retry window has passed it becomes a dead letter
-- (reason 'endpoint disabled', category 'disabled') that can be replayed. Bounded per call;
-- returns how many.
CREATE OR REPLACE FUNCTION webhooks.expire_disabled_endpoint_rows(p_limit integer DEFAULT 1000) RETURNS integer
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
    WITH expired AS (
        SELECT q.delivery_id
        FROM webhooks.endpoints e
        CROSS JOIN webhooks.delivery_config c
        JOIN webhooks.alert_delivery_queue q
          ON q.webhook_id = e.id AND q.status IN ('pending', 'retrying')
        WHERE NOT e.active
          AND q.scheduled_at + webhooks.retry_window(
                coalesce(e.retry_schedule, c.retry_schedule),
                coalesce(q.max_attempts, e.max_attempts, c.max_attempts)) < now()
        LIMIT p_limit
        FOR UPDATE OF q SKIP LOCKED
    ), dead AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = 'dead_letter', dead_letter_reason = 'endpoint disabled', failure_category = 'disabled',
            dead_lettered_at = now(), updated_at = now()
        FROM expired x WHERE q.delivery_id = x.delivery_id
        RETURNING q.delivery_id, q.webhook_id, q.attempts
    ), logged AS (
        INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome, failure_category, error)
        SELECT delivery_id, webhook_id, attempts, 'dead_letter', 'disabled', 'endpoint disabled' FROM dead
        RETURNING 1
    )
    SELECT count(*)::integer FROM logged;
$$;

UPDATE webhooks.alert_delivery_queue
SET failure_category = 'disabled', updated_at = now()
WHERE status = 'dead_letter' AND dead_letter_reason = 'endpoint disabled'
  AND failure_category IS DISTINCT FROM 'disabled';

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
        SELECT o.*, q.webhook_id,
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
             error, response_excerpt, worker_id, lease_token, stale)
        SELECT t.delivery_id, t.webhook_id, t.attempt,
               CASE t.decision WHEN 'exhausted' THEN 'dead_letter' ELSE t.decision END,
               t.failure_category, t.http_status, t.latency_ms,
               CASE WHEN t.decision = 'exhausted'
                    THEN concat_ws(': ', 'attempts exhausted', t.error) ELSE t.error END,
               left(t.response_excerpt, 1024), p_worker_id, t.lease_token, a.delivery_id IS NULL
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
