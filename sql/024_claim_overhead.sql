-- 024_claim_overhead: the two clean-ups every claim runs first, reap_expired_leases() and
-- expire_deliveries(), were SQL functions, which PostgreSQL plans afresh on every call (about 1 ms of
-- a claim's time, measured by bench/). As PL/pgSQL their statements keep a cached plan, and each
-- first asks the (small) partial index whether there is anything to do at all, which is almost
-- always no. Same statements, same results.

CREATE OR REPLACE FUNCTION webhooks.reap_expired_leases(p_limit integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    v_count integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhooks.alert_delivery_queue
                   WHERE status = 'delivering' AND locked_until < now()) THEN
        RETURN 0;
    END IF;
    WITH cfg AS (
        SELECT max_attempts FROM webhooks.delivery_config
    ), expired AS (
        SELECT q.delivery_id, q.lease_token, q.locked_by,
               q.attempts >= coalesce(q.max_attempts, e.max_attempts, cfg.max_attempts) AS exhausted
        FROM webhooks.alert_delivery_queue q
        JOIN webhooks.endpoints e ON e.id = q.webhook_id
        CROSS JOIN cfg
        WHERE q.status = 'delivering' AND q.locked_until < now()
        ORDER BY q.locked_until
        LIMIT p_limit
        FOR UPDATE OF q SKIP LOCKED
    ), reaped AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = CASE WHEN x.exhausted THEN 'dead_letter' ELSE 'retrying' END,
            next_retry_at = now(),
            locked_by = NULL, lease_token = NULL, locked_until = NULL,
            failure_category = 'internal',
            last_error = 'lease expired',
            dead_letter_reason = CASE WHEN x.exhausted THEN 'lease expired' END,
            dead_lettered_at = CASE WHEN x.exhausted THEN now() END,
            updated_at = now()
        FROM expired x
        WHERE q.delivery_id = x.delivery_id
        RETURNING q.delivery_id, q.webhook_id, q.attempts, q.status, x.lease_token, x.locked_by
    ), logged AS (
        INSERT INTO webhooks.alert_delivery_log
            (delivery_id, webhook_id, attempt, outcome, failure_category, error, worker_id, lease_token)
        SELECT delivery_id, webhook_id, attempts, 'lease_expired', 'internal',
               CASE WHEN status = 'dead_letter' THEN 'lease expired on the last attempt'
                    ELSE 'lease expired' END,
               locked_by, lease_token
        FROM reaped
        RETURNING 1
    )
    SELECT count(*)::integer INTO v_count FROM logged;
    RETURN v_count;
END;
$$;

CREATE OR REPLACE FUNCTION webhooks.expire_deliveries(p_limit integer DEFAULT 1000) RETURNS integer
LANGUAGE plpgsql
SET jit = off
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
