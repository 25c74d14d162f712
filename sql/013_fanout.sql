-- 013_fanout: producers publish events; each event becomes one delivery per subscribed endpoint.
--
-- webhooks.publish() fans an event out to every active endpoint whose event_types match ('*',
-- the exact type, or a prefix pattern such as 'alert.*'). Every delivery of one event shares its
-- event id, which is also each delivery's idempotency key. Given a stable event key, the event id
-- is derived from it, so a producer that retries publishes nothing twice and never fails:
-- ON CONFLICT DO NOTHING. webhooks.observer_queue_alert() is the trigger an application attaches
-- to its own table:
--   CREATE TRIGGER alerts_webhooks AFTER INSERT ON alerts FOR EACH ROW
--       EXECUTE FUNCTION webhooks.observer_queue_alert('alert.created', 'id');
-- Arguments: the event type, or 'column:<name>' to read it from the row; optionally the column
-- holding a stable event key. The payload is the row as JSON.

CREATE FUNCTION webhooks.subscribes(p_event_types text[], p_event_type text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM unnest(p_event_types) AS t
        WHERE t = '*' OR t = p_event_type
           OR (t LIKE '%.*' AND starts_with(p_event_type, left(t, -1))));
$$;

CREATE FUNCTION webhooks.publish(
    p_event_type text,
    p_payload    jsonb,
    p_event_key  text DEFAULT NULL,
    p_source_ref text DEFAULT NULL,
    p_priority   integer DEFAULT 0,
    -- for operational events: never to this endpoint, and only to explicit subscribers ('*' is not)
    p_exclude_webhook_id bigint  DEFAULT NULL,
    p_explicit_only      boolean DEFAULT false
) RETURNS integer
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    v_event_id text := CASE
        WHEN p_event_key IS NULL THEN 'evt_' || replace(gen_random_uuid()::text, '-', '')
        ELSE 'evt_' || md5(p_event_type || ':' || p_event_key) END;
    v_queued integer;
BEGIN
    INSERT INTO webhooks.alert_delivery_queue
        (webhook_id, event_id, idempotency_key, event_type, payload, source_ref, priority)
    SELECT e.id, v_event_id, v_event_id, p_event_type, p_payload, p_source_ref, p_priority
    FROM webhooks.endpoints e
    WHERE e.active AND e.id IS DISTINCT FROM p_exclude_webhook_id
      AND webhooks.subscribes(CASE WHEN p_explicit_only THEN array_remove(e.event_types, '*')
                                   ELSE e.event_types END, p_event_type)
    ORDER BY e.id
    ON CONFLICT (webhook_id, idempotency_key) DO NOTHING;
    GET DIAGNOSTICS v_queued = ROW_COUNT;
    RETURN v_queued;
END;
$$;

CREATE FUNCTION webhooks.observer_queue_alert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_row        jsonb := to_jsonb(NEW);
    v_event_type text := TG_ARGV[0];
    v_key        text;
BEGIN
    IF TG_NARGS < 1 THEN
        RAISE EXCEPTION 'webhooks.observer_queue_alert needs an event type argument';
    END IF;
    IF starts_with(v_event_type, 'column:') THEN
        v_event_type := v_row ->> substr(v_event_type, 8);
        IF v_event_type IS NULL THEN
            RAISE EXCEPTION 'webhooks.observer_queue_alert: column % is missing or null', TG_ARGV[0];
        END IF;
    END IF;
    IF TG_NARGS >= 2 THEN
        v_key := TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME || ':' || (v_row ->> TG_ARGV[1]);
    END IF;
    PERFORM webhooks.publish(
        v_event_type, v_row, v_key,
        TG_TABLE_NAME || coalesce(':' || (v_row ->> coalesce(TG_ARGV[1], 'id')), ''));
    RETURN NULL;
END;
$$;
