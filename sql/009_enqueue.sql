-- 009_enqueue: webhooks.enqueue(), the idempotent way in for producers that may retry.
--
-- Returns the delivery id, new or existing. A duplicate key neither raises nor aborts the caller's
-- transaction: INSERT ... ON CONFLICT DO NOTHING, then a read of the row that won.

CREATE FUNCTION webhooks.enqueue(
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
