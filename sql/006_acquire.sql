-- 006_acquire: webhooks.acquire(), the claim. One short transaction, never held across HTTP.
--
-- It first takes back rows whose lease expired (a crashed or stalled worker): they become claimable
-- again, or, if the lost attempt was their last, dead letters with reason 'lease expired'. Then it
-- claims up to p_batch_size due rows, highest priority first, then oldest due, with FOR UPDATE
-- SKIP LOCKED so that concurrent workers never wait on each other. Each claimed row gets a new
-- lease token (the fencing token webhooks.finish() checks) and its attempt is counted now, so a
-- payload that crashes workers cannot loop forever.

CREATE FUNCTION webhooks.reap_expired_leases(p_limit integer DEFAULT 1000) RETURNS integer
LANGUAGE sql
-- Short OLTP statements: JIT compilation would cost far more than it saves.
SET jit = off
AS $$
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
    SELECT count(*)::integer FROM logged;
$$;

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
    timeout_ms       integer,     -- the endpoint's own timeout; NULL means the worker's default
    retry_schedule   jsonb,
    retry_jitter     real,
    created_at       timestamptz
)
LANGUAGE plpgsql
-- Short OLTP statements: JIT compilation would cost far more than it saves.
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    PERFORM webhooks.reap_expired_leases();

    RETURN QUERY
    WITH cfg AS (
        SELECT * FROM webhooks.delivery_config
    ), due AS (
        SELECT q.delivery_id
        FROM webhooks.alert_delivery_queue q
        WHERE q.status IN ('pending', 'retrying')
          AND q.next_retry_at <= now()
          AND EXISTS (SELECT 1 FROM webhooks.endpoints e WHERE e.id = q.webhook_id AND e.active)
        ORDER BY q.priority DESC, q.next_retry_at, q.delivery_id
        LIMIT p_batch_size
        FOR UPDATE OF q SKIP LOCKED
    )
    UPDATE webhooks.alert_delivery_queue q
    SET status = 'delivering',
        attempts = q.attempts + 1,
        locked_by = p_worker_id,
        lease_token = gen_random_uuid(),
        locked_until = now() + make_interval(secs => p_lease_seconds),
        updated_at = now()
    FROM due, webhooks.endpoints e, cfg
    WHERE q.delivery_id = due.delivery_id AND e.id = q.webhook_id
    RETURNING q.delivery_id, q.webhook_id, q.event_id, q.idempotency_key, q.event_type,
              q.payload::text, q.attempts,
              coalesce(q.max_attempts, e.max_attempts, cfg.max_attempts),
              q.deferrals, q.replays, q.lease_token, q.locked_until, q.traceparent,
              e.url, e.signing_secrets, e.headers, e.body_format,
              e.timeout_ms,
              coalesce(e.retry_schedule, cfg.retry_schedule),
              cfg.retry_jitter, q.created_at;
END;
$$;
