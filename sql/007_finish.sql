-- 007_finish: webhooks.finish(), the outcome write for a batch of attempts, in one transaction.
--
-- p_outcomes is a JSON array, one object per attempt:
--   {"delivery_id", "lease_token", "attempt", "outcome": delivered | retry | deferred | dead_letter,
--    "retry_after_s", "http_status", "failure_category", "error", "response_excerpt",
--    "latency_ms", "reason", "disable_endpoint"}
-- The worker decides what an HTTP result means (classification and backoff are pure Python); this
-- function applies it under the fencing rule: a row changes only if it is still 'delivering' under
-- the same lease token. A late outcome (its lease was taken over) leaves the row alone but is still
-- logged, marked stale, so the history is complete. Whether attempts are exhausted is decided here,
-- from the row, the endpoint and webhooks.delivery_config. A deferral (Retry-After on 429/503) gives
-- the attempt back, up to max_deferrals; past that it counts as an attempt.
-- Health rows are written once per endpoint, in endpoint-id order, so batches never deadlock.

CREATE TYPE webhooks.attempt_outcome AS (
    delivery_id      bigint,
    lease_token      uuid,
    attempt          integer,
    outcome          text,
    retry_after_s    double precision,
    http_status      integer,
    failure_category text,
    error            text,
    response_excerpt text,
    latency_ms       integer,
    reason           text,
    disable_endpoint boolean
);

CREATE FUNCTION webhooks.health_status(consecutive_failures bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN consecutive_failures = 0 THEN 'healthy'
                WHEN consecutive_failures < 5 THEN 'degraded'
                ELSE 'failing' END;
$$;

CREATE FUNCTION webhooks.finish(p_worker_id text, p_outcomes jsonb)
RETURNS TABLE (delivery_id bigint, applied boolean, status text)
LANGUAGE plpgsql
-- Short OLTP statements: JIT compilation would cost far more than it saves.
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH o AS (
        SELECT r.*, item.ord
        FROM jsonb_array_elements(p_outcomes) WITH ORDINALITY AS item(value, ord),
             jsonb_populate_record(NULL::webhooks.attempt_outcome, item.value) AS r
    ), cfg AS (
        SELECT max_attempts, max_deferrals FROM webhooks.delivery_config
    ), target AS (
        -- the rows as they were, with the decision each outcome leads to
        SELECT o.delivery_id, o.lease_token, q.webhook_id,
               (q.status = 'delivering' AND q.lease_token = o.lease_token) AS holds_lease,
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
            deferrals = CASE WHEN o.outcome = 'deferred' THEN q.deferrals + 1 ELSE q.deferrals END,
            next_retry_at = CASE WHEN t.decision IN ('retry', 'deferred')
                                 THEN now() + make_interval(secs => coalesce(o.retry_after_s, 0))
                                 ELSE q.next_retry_at END,
            locked_by = NULL, lease_token = NULL, locked_until = NULL,
            last_http_status = o.http_status,
            last_error = o.error,
            failure_category = o.failure_category,
            dead_letter_reason = CASE t.decision
                                     WHEN 'dead_letter' THEN coalesce(o.reason, o.error)
                                     WHEN 'exhausted' THEN 'attempts exhausted'
                                 END,
            delivered_at = CASE WHEN t.decision = 'delivered' THEN now() END,
            dead_lettered_at = CASE WHEN t.decision IN ('dead_letter', 'exhausted') THEN now() END,
            updated_at = now()
        FROM o, target t
        WHERE q.delivery_id = o.delivery_id AND t.delivery_id = o.delivery_id
          AND q.status = 'delivering' AND q.lease_token = o.lease_token
        RETURNING q.delivery_id, q.status
    ), logged AS (
        INSERT INTO webhooks.alert_delivery_log
            (delivery_id, webhook_id, attempt, outcome, failure_category, http_status, latency_ms,
             error, response_excerpt, worker_id, lease_token, stale)
        SELECT o.delivery_id, t.webhook_id, o.attempt,
               CASE t.decision WHEN 'exhausted' THEN 'dead_letter' ELSE t.decision END,
               o.failure_category, o.http_status, o.latency_ms,
               CASE WHEN t.decision = 'exhausted'
                    THEN concat_ws(': ', 'attempts exhausted', o.error) ELSE o.error END,
               left(o.response_excerpt, 1024), p_worker_id, o.lease_token, a.delivery_id IS NULL
        FROM o
        JOIN target t ON t.delivery_id = o.delivery_id
        LEFT JOIN applied a ON a.delivery_id = o.delivery_id
        RETURNING 1
    ), per_endpoint AS (
        SELECT t.webhook_id,
               count(*) AS attempts,
               count(*) FILTER (WHERE o.outcome = 'delivered') AS successes,
               count(*) FILTER (WHERE o.outcome <> 'delivered') AS failures,
               -- failures after the batch's last success carry on the streak
               count(*) FILTER (WHERE o.outcome <> 'delivered' AND o.ord > coalesce(
                   (SELECT max(o2.ord) FROM o o2 JOIN target t2 ON t2.delivery_id = o2.delivery_id
                    WHERE t2.webhook_id = t.webhook_id AND o2.outcome = 'delivered'), 0)) AS trailing_failures,
               bool_or(o.outcome = 'delivered') AS any_success,
               coalesce(sum(o.latency_ms), 0) AS latency_ms,
               (array_agg(o.http_status ORDER BY o.ord DESC))[1] AS last_http_status,
               (array_agg(o.failure_category ORDER BY o.ord DESC)
                   FILTER (WHERE o.outcome <> 'delivered'))[1] AS last_failure_category
        FROM o JOIN target t ON t.delivery_id = o.delivery_id
        GROUP BY t.webhook_id
    ), health AS (
        INSERT INTO webhooks.webhook_health_metrics AS h
            (webhook_id, total_attempts, successes, failures, consecutive_failures,
             total_latency_ms, last_success_at, last_failure_at, last_http_status,
             last_failure_category, health_status, updated_at)
        SELECT p.webhook_id, p.attempts, p.successes, p.failures, p.trailing_failures,
               p.latency_ms,
               CASE WHEN p.any_success THEN now() END,
               CASE WHEN p.failures > 0 THEN now() END,
               p.last_http_status, p.last_failure_category,
               webhooks.health_status(p.trailing_failures), now()
        FROM per_endpoint p
        ORDER BY p.webhook_id
        ON CONFLICT (webhook_id) DO UPDATE
        SET total_attempts = h.total_attempts + excluded.total_attempts,
            successes = h.successes + excluded.successes,
            failures = h.failures + excluded.failures,
            consecutive_failures = CASE WHEN excluded.last_success_at IS NOT NULL
                                        THEN excluded.consecutive_failures
                                        ELSE h.consecutive_failures + excluded.consecutive_failures END,
            total_latency_ms = h.total_latency_ms + excluded.total_latency_ms,
            last_success_at = coalesce(excluded.last_success_at, h.last_success_at),
            last_failure_at = coalesce(excluded.last_failure_at, h.last_failure_at),
            last_http_status = excluded.last_http_status,
            last_failure_category = coalesce(excluded.last_failure_category, h.last_failure_category),
            health_status = webhooks.health_status(
                CASE WHEN excluded.last_success_at IS NOT NULL
                     THEN excluded.consecutive_failures
                     ELSE h.consecutive_failures + excluded.consecutive_failures END),
            updated_at = now()
        RETURNING 1
    ), disabled AS (
        -- 410 Gone: the receiver says this endpoint no longer exists
        UPDATE webhooks.endpoints e
        SET active = false,
            disabled_reason = 'HTTP 410 Gone on delivery ' || g.delivery_id,
            disabled_at = now(),
            updated_at = now()
        FROM (SELECT DISTINCT ON (t.webhook_id) t.webhook_id, o.delivery_id
              FROM o JOIN target t ON t.delivery_id = o.delivery_id
              WHERE o.disable_endpoint
              ORDER BY t.webhook_id, o.ord) g
        WHERE e.id = g.webhook_id AND e.active
        RETURNING 1
    )
    SELECT o.delivery_id, a.delivery_id IS NOT NULL, coalesce(a.status, 'stale')
    FROM o LEFT JOIN applied a ON a.delivery_id = o.delivery_id
    ORDER BY o.ord;  -- logged, health and disabled run to completion although unreferenced
END;
$$;
