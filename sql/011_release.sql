-- 011_release: webhooks.release(), giving claimed rows back without counting their attempt.
--
-- A worker shutting down calls it for rows it claimed but could not finish within its grace.
-- p_leases is [{"delivery_id", "lease_token"}]; only rows still held under that token change.

CREATE FUNCTION webhooks.release(p_worker_id text, p_leases jsonb) RETURNS integer
LANGUAGE sql
-- Short OLTP statements: JIT compilation would cost far more than it saves.
SET jit = off
AS $$
    WITH l AS (
        SELECT (x ->> 'delivery_id')::bigint AS delivery_id, (x ->> 'lease_token')::uuid AS lease_token
        FROM jsonb_array_elements(p_leases) x
    ), released AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = CASE WHEN q.attempts <= 1 AND q.failure_category IS NULL
                          THEN 'pending' ELSE 'retrying' END,
            attempts = q.attempts - 1,
            next_retry_at = now(),
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
