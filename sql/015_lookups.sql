-- 015_lookups: answering "what happened to this delivery?" from psql.
--
--   SELECT * FROM webhooks.delivery(42);                      -- the row, with its endpoint's name
--   SELECT * FROM webhooks.delivery_by_key('alert-42');       -- every endpoint's delivery of a key
--   SELECT * FROM webhooks.delivery_history(42);              -- every attempt and state change

CREATE VIEW webhooks.delivery_overview AS
SELECT q.delivery_id, q.webhook_id, e.name AS endpoint_name, e.url_display AS endpoint,
       q.event_id, q.idempotency_key, q.event_type, q.status, q.attempts, q.deferrals, q.replays,
       coalesce(q.max_attempts, e.max_attempts, c.max_attempts) AS max_attempts,
       q.next_retry_at, q.locked_by, q.locked_until, q.last_http_status, q.failure_category,
       q.last_error, q.dead_letter_reason, q.priority, q.source_ref, q.payload, q.created_at,
       q.delivered_at, q.dead_lettered_at
FROM webhooks.alert_delivery_queue q
JOIN webhooks.endpoints e ON e.id = q.webhook_id
CROSS JOIN webhooks.delivery_config c;

CREATE FUNCTION webhooks.delivery(p_delivery_id bigint)
RETURNS SETOF webhooks.delivery_overview
LANGUAGE sql STABLE AS $$
    SELECT * FROM webhooks.delivery_overview WHERE delivery_id = p_delivery_id;
$$;

CREATE FUNCTION webhooks.delivery_by_key(p_idempotency_key text, p_webhook_id bigint DEFAULT NULL)
RETURNS SETOF webhooks.delivery_overview
LANGUAGE sql STABLE AS $$
    SELECT * FROM webhooks.delivery_overview
    WHERE idempotency_key = p_idempotency_key AND (p_webhook_id IS NULL OR webhook_id = p_webhook_id)
    ORDER BY webhook_id;
$$;

CREATE FUNCTION webhooks.delivery_history(p_delivery_id bigint)
RETURNS SETOF webhooks.alert_delivery_log
LANGUAGE sql STABLE AS $$
    SELECT * FROM webhooks.alert_delivery_log WHERE delivery_id = p_delivery_id ORDER BY logged_at, log_id;
$$;
