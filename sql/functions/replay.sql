-- replay: putting finished deliveries back in the queue, and answering "what happened to this
-- delivery?" from psql:
--   SELECT * FROM webhooks.delivery(42);                      -- the row, with its endpoint's name
--   SELECT * FROM webhooks.delivery_by_key('alert-42');       -- every endpoint's delivery of a key
--   SELECT * FROM webhooks.delivery_history(42);              -- every attempt and state change
--
-- A replay is the same row, sent again: status back to 'pending', attempts and deferrals reset,
-- `replays` incremented, the same idempotency key (so a receiver that already processed it can
-- deduplicate). The audit log keeps every earlier attempt and records the replay. An operator who
-- wants a new event enqueues a new one. Both put rows back through the gate
-- (queue_deliveries(), functions/enqueue.sql), which keeps to the caller's tenant and leaves a
-- deleted endpoint's rows as history.

-- One delivery, dead-lettered or delivered. Returns whether it was put back (false too for another
-- tenant's, to a session kept to a tenant). Granted to webhooks_admin and webhooks_tenant_admin
-- (the HTTP API's admin requests), which write no table themselves.
CREATE OR REPLACE FUNCTION webhooks.replay(p_delivery_id bigint) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM webhooks.queue_deliveries(NULL, 'operator', ARRAY[p_delivery_id])) THEN
        PERFORM pg_notify('webhooks_queue', '');
        RETURN true;
    END IF;
    RETURN false;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.replay(bigint) TO webhooks_admin, webhooks_tenant_admin;

-- Why a delivery is not replayed, in words for the person who asked (the API's 409, the CLI's
-- error, the console's notice): its endpoint was deleted, or it is not a dead letter or delivered
-- row. NULL when it can be replayed, or the caller does not see it (delivery_overview keeps a
-- session to its tenant).
CREATE OR REPLACE FUNCTION webhooks.replay_refusal(p_delivery_id bigint) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT CASE
        WHEN v.endpoint_deleted_at IS NOT NULL THEN
            format('delivery %s belongs to endpoint %s (id %s), deleted %s: a deleted endpoint''s rows are '
                   'kept as history and never sent again', v.delivery_id, v.endpoint_name, v.webhook_id,
                   to_char(v.endpoint_deleted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"'))
        WHEN v.status NOT IN ('dead_letter', 'delivered') THEN
            format('delivery %s is %s: only dead letters and delivered rows are replayed (was it '
                   'replayed already?)', v.delivery_id, v.status)
    END
    FROM webhooks.delivery_overview v
    WHERE v.delivery_id = p_delivery_id;
$$;
GRANT EXECUTE ON FUNCTION webhooks.replay_refusal(bigint) TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;

-- Every dead letter matching all the given filters (NULL matches anything), at most p_limit of
-- them, oldest first, so a large recovery can run in bounded, resumable steps. Returns the count.
-- Kept to the session's tenant (caller_tenant()) and to p_tenant_id, a bulk operation's tenant,
-- when either is set. The owner's alone: the API reaches it through its operations (api.sql).
CREATE OR REPLACE FUNCTION webhooks.replay_dead_letters(
    p_webhook_id       bigint      DEFAULT NULL,
    p_event_type       text        DEFAULT NULL,
    p_failure_category text        DEFAULT NULL,
    p_since            timestamptz DEFAULT NULL,
    p_until            timestamptz DEFAULT NULL,
    p_limit            integer     DEFAULT NULL,
    p_tenant_id        bigint      DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    v_count integer;
    v_tenant bigint := webhooks.caller_tenant();
BEGIN
    SELECT count(*) INTO v_count
    FROM webhooks.queue_deliveries(NULL, 'operator', ARRAY(
        SELECT q.delivery_id
        FROM webhooks.alert_delivery_queue q
        WHERE q.status = 'dead_letter'
          AND (p_webhook_id IS NULL OR q.webhook_id = p_webhook_id)
          AND (p_event_type IS NULL OR q.event_type = p_event_type)
          AND (p_failure_category IS NULL OR q.failure_category = p_failure_category)
          AND (p_since IS NULL OR q.dead_lettered_at >= p_since)
          AND (p_until IS NULL OR q.dead_lettered_at < p_until)
          -- the session's tenant, if it set one (`replay --all --tenant T`)
          AND (v_tenant IS NULL OR q.tenant_id = v_tenant)
          AND (p_tenant_id IS NULL OR q.tenant_id = p_tenant_id)
        ORDER BY q.dead_lettered_at, q.delivery_id
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ));
    IF v_count > 0 THEN
        PERFORM pg_notify('webhooks_queue', '');
    END IF;
    RETURN coalesce(v_count, 0);
END;
$$;

CREATE OR REPLACE VIEW webhooks.delivery_overview AS
SELECT q.delivery_id, q.webhook_id, coalesce(e.name, d.name) AS endpoint_name, e.url_display AS endpoint,
       q.event_id, q.idempotency_key, q.event_type, q.status, q.attempts, q.deferrals, q.replays,
       coalesce(q.max_attempts, e.max_attempts, c.max_attempts) AS max_attempts,
       q.next_retry_at, q.locked_by, q.locked_until, q.last_http_status, q.failure_category,
       q.last_error, q.dead_letter_reason, q.priority, coalesce(m.source_ref, q.source_ref) AS source_ref,
       coalesce(m.payload, q.payload) AS payload, q.created_at,
       q.delivered_at, q.dead_lettered_at,
       -- a deleted endpoint's finished rows stay as history, under its id and name
       d.deleted_at AS endpoint_deleted_at
FROM webhooks.alert_delivery_queue q
LEFT JOIN webhooks.messages m ON m.message_id = q.message_id
LEFT JOIN webhooks.endpoints e ON e.id = q.webhook_id
LEFT JOIN webhooks.deleted_endpoints d ON d.id = q.webhook_id
CROSS JOIN webhooks.delivery_config c
-- a view runs as its owner, whom row-level security does not bind: it applies the tenant itself
WHERE (SELECT webhooks.caller_tenant()) IS NULL OR q.tenant_id = (SELECT webhooks.caller_tenant());
GRANT SELECT ON webhooks.delivery_overview TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;

CREATE OR REPLACE FUNCTION webhooks.delivery(p_delivery_id bigint)
RETURNS SETOF webhooks.delivery_overview
LANGUAGE sql STABLE AS $$
    SELECT * FROM webhooks.delivery_overview WHERE delivery_id = p_delivery_id;
$$;
GRANT EXECUTE ON FUNCTION webhooks.delivery(bigint) TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;

CREATE OR REPLACE FUNCTION webhooks.delivery_by_key(p_idempotency_key text, p_webhook_id bigint DEFAULT NULL)
RETURNS SETOF webhooks.delivery_overview
LANGUAGE sql STABLE AS $$
    SELECT * FROM webhooks.delivery_overview
    WHERE idempotency_key = p_idempotency_key
      AND webhook_id = ANY (CASE WHEN p_webhook_id IS NULL THEN ARRAY(SELECT id FROM webhooks.endpoints)
                                 ELSE ARRAY[p_webhook_id] END)
    ORDER BY webhook_id;
$$;
GRANT EXECUTE ON FUNCTION webhooks.delivery_by_key(text, bigint) TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;

CREATE OR REPLACE FUNCTION webhooks.delivery_history(p_delivery_id bigint)
RETURNS SETOF webhooks.alert_delivery_log
LANGUAGE sql STABLE AS $$
    SELECT * FROM webhooks.alert_delivery_log WHERE delivery_id = p_delivery_id ORDER BY logged_at, log_id;
$$;
GRANT EXECUTE ON FUNCTION webhooks.delivery_history(bigint) TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;
