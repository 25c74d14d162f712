-- enqueue: the ways in. A plain INSERT into webhooks.alert_delivery_queue, webhooks.enqueue() (the
-- idempotent way for producers that may retry), webhooks.publish() (one event, one delivery per
-- subscribed endpoint), and webhooks.observer_queue_alert(), the trigger an application attaches to
-- its own table:
--   CREATE TRIGGER alerts_webhooks AFTER INSERT ON alerts FOR EACH ROW
--       EXECUTE FUNCTION webhooks.observer_queue_alert('alert.created', 'id');
-- (arguments: the event type, or 'column:<name>' to read it from the row; optionally the column
-- holding a stable event key; the payload is the row as JSON).
--
-- Every way passes through the queue's insert triggers: fill_idempotency_key() sets the row's tenant
-- from its endpoint (never from the producer), bounds the payload,
-- metadata and source_ref, defaults the key to the event id and stores what was published as a
-- message (webhooks.messages: once for every delivery of one event; the delivery row keeps only
-- a pointer to it, and its payload, metadata and source_ref columns stay NULL; the view
-- webhooks.deliveries reads them back); refuse_reserved_event_type() keeps
-- 'webhook.*' for the worker's own events; notify_workers() sends one NOTIFY per statement (not per
-- row), switchable off in delivery_config for very high insert rates. A duplicate key neither
-- raises nor aborts the producer's transaction (ON CONFLICT DO NOTHING). Every delivery of one
-- event shares its event id, which is also each delivery's idempotency key; given a stable event
-- key, the event id is derived from it, so a producer that retries publishes nothing twice.

CREATE OR REPLACE FUNCTION webhooks.fill_idempotency_key() RETURNS trigger
LANGUAGE plpgsql
-- Runs for producers that may not read endpoints or the config (see roles.sql).
SECURITY DEFINER SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_limit   integer;
    v_size    integer;
    v_tenant  bigint;
    v_expires timestamptz;
    v_message bigint;
BEGIN
    SELECT c.max_payload_bytes INTO v_limit FROM webhooks.delivery_config c;
    -- The text form is what is sent; the stored (binary, maybe compressed) size is no bound on it.
    v_size := octet_length(NEW.payload::text);
    IF v_size > v_limit THEN
        RAISE EXCEPTION 'webhook payload is % bytes; the limit is % bytes', v_size, v_limit
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Send a smaller payload (for example an id the receiver looks up), or raise '
                         'webhooks.delivery_config.max_payload_bytes.';
    END IF;
    -- Fixed limits: neither is sent to the receiver, and neither needs to be large.
    v_size := octet_length(NEW.metadata::text);
    IF v_size > 65536 THEN
        RAISE EXCEPTION 'webhook metadata is % bytes; the limit is 65536 bytes', v_size
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    v_size := octet_length(NEW.source_ref);
    IF v_size > 4096 THEN
        RAISE EXCEPTION 'webhook source_ref is % bytes; the limit is 4096 bytes', v_size
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF NEW.idempotency_key IS NULL THEN
        NEW.idempotency_key := NEW.event_id;
    END IF;
    -- The endpoint's tenant, whatever the producer wrote (a producer cannot choose its tenant), and
    -- its default time to live, if it has one. No such endpoint (never was, or deleted): refused,
    -- as a foreign key would (a deleted endpoint's rows stay, so the queue holds none). KEY SHARE:
    -- an endpoint being deleted (api_delete_endpoint) is waited for, then found gone.
    SELECT e.tenant_id, now() + e.delivery_ttl INTO v_tenant, v_expires
    FROM webhooks.endpoints e WHERE e.id = NEW.webhook_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'webhook_id %: no such endpoint', NEW.webhook_id
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    NEW.tenant_id := v_tenant;
    IF NEW.expires_at IS NULL THEN
        NEW.expires_at := v_expires;
    END IF;

    -- The message. A message records the range of delivery ids that point at it, which retention
    -- reads to find whether any is left (release_messages(), functions/retention.sql), and only the
    -- transaction that made it adds deliveries to it: once committed, its deliveries only go.
    IF NEW.message_id IS NULL THEN
        IF NEW.payload IS NULL THEN
            RAISE EXCEPTION 'null value in column "payload" of relation "alert_delivery_queue" violates '
                            'not-null constraint'
                USING ERRCODE = 'not_null_violation', SCHEMA = 'webhooks',
                      TABLE = 'alert_delivery_queue', COLUMN = 'payload';
        END IF;
        -- A key this endpoint already has: the row is not inserted (ON CONFLICT DO NOTHING, or a
        -- unique violation), so no message is made for it. It is inserted only if that row is being
        -- deleted now (the insert waits for the delete), and then it keeps what was published in
        -- its own columns, as a row inserted with the triggers off does: no message is borrowed
        -- from a row whose deletion may be reclaiming it.
        PERFORM FROM webhooks.alert_delivery_queue q
        WHERE q.webhook_id = NEW.webhook_id AND q.idempotency_key = NEW.idempotency_key;
        IF FOUND THEN
            RETURN NEW;
        END IF;
        -- The same event queued earlier in this transaction (a fan-out, in this statement or an
        -- earlier one: the same tenant, event id and fields) lends its message; else a new one.
        -- created_at is the making transaction's start (now()), so no other transaction's message
        -- is found, and none is ever waited for. A range stays under 1,000 ids wide: reclaiming
        -- reads it (at most that many entries of the primary key), and an INSERT whose rows of one
        -- event lie far apart (one event per endpoint, endpoint after endpoint) or a fan-out to
        -- thousands of endpoints stores its payload once per 1,000 rows rather than once.
        UPDATE webhooks.messages m
        SET first_delivery_id = least(m.first_delivery_id, NEW.delivery_id),
            last_delivery_id = greatest(m.last_delivery_id, NEW.delivery_id)
        WHERE m.message_id = (
            SELECT o.message_id FROM webhooks.messages o
            WHERE o.tenant_id = NEW.tenant_id AND o.event_id = NEW.event_id AND o.created_at = now()
              AND o.event_type = NEW.event_type AND o.payload = NEW.payload
              AND o.metadata = coalesce(NEW.metadata, '{}')
              AND o.source_ref IS NOT DISTINCT FROM NEW.source_ref
              AND o.traceparent IS NOT DISTINCT FROM NEW.traceparent
              AND o.first_delivery_id IS NOT NULL
              AND greatest(o.last_delivery_id, NEW.delivery_id)
                  - least(o.first_delivery_id, NEW.delivery_id) < 1000
            LIMIT 1)
        RETURNING m.message_id INTO v_message;
        IF v_message IS NULL THEN
            INSERT INTO webhooks.messages
                (tenant_id, event_id, event_type, traceparent, source_ref, metadata, payload,
                 first_delivery_id, last_delivery_id)
            VALUES (NEW.tenant_id, NEW.event_id, NEW.event_type, NEW.traceparent, NEW.source_ref,
                    coalesce(NEW.metadata, '{}'), NEW.payload, NEW.delivery_id, NEW.delivery_id)
            RETURNING message_id INTO v_message;
        END IF;
        NEW.message_id := v_message;
    ELSE
        -- A row given its message by the caller (a function of ours that made it): its range is
        -- widened under the message's row lock, so a deletion looking at it waits for this one.
        -- (A message without a range, never reclaimed, keeps none.)
        UPDATE webhooks.messages m
        SET first_delivery_id = CASE WHEN m.first_delivery_id IS NOT NULL
                                     THEN least(m.first_delivery_id, NEW.delivery_id) END,
            last_delivery_id = CASE WHEN m.first_delivery_id IS NOT NULL
                                    THEN greatest(m.last_delivery_id, NEW.delivery_id) END
        WHERE m.message_id = NEW.message_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'message_id %: no such message', NEW.message_id
                USING ERRCODE = 'foreign_key_violation';
        END IF;
    END IF;
    NEW.payload := NULL;
    NEW.metadata := NULL;
    NEW.source_ref := NULL;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER fill_idempotency_key
    BEFORE INSERT ON webhooks.alert_delivery_queue
    FOR EACH ROW EXECUTE FUNCTION webhooks.fill_idempotency_key();

-- SECURITY INVOKER on purpose: current_user must be the role that inserts (inside the owner's
-- SECURITY DEFINER functions, that is the owner). USAGE: holding the owner's privileges now (the
-- owner, a role inheriting them, a superuser), not merely a membership it has not SET.
CREATE OR REPLACE FUNCTION webhooks.refuse_reserved_event_type() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RAISE EXCEPTION 'event type % is reserved: types starting with ''webhook.'' are the worker''s own '
                        'operational events', NEW.event_type
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;

-- The WHEN clause keeps the cost off every ordinary insert.
CREATE OR REPLACE TRIGGER refuse_reserved_event_type
    BEFORE INSERT ON webhooks.alert_delivery_queue
    FOR EACH ROW WHEN (starts_with(NEW.event_type, 'webhook.'))
    EXECUTE FUNCTION webhooks.refuse_reserved_event_type();

CREATE OR REPLACE FUNCTION webhooks.notify_workers() RETURNS trigger
LANGUAGE plpgsql
-- reads delivery_config for any inserting role; it touches no row data
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    IF (SELECT notify_enabled FROM webhooks.delivery_config) THEN
        -- PostgreSQL folds identical notifications within a transaction into one.
        PERFORM pg_notify('webhooks_queue', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER notify_workers
    AFTER INSERT ON webhooks.alert_delivery_queue
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks.notify_workers();

CREATE OR REPLACE FUNCTION webhooks.enqueue(
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
-- SECURITY INVOKER: the insert trigger must see the caller. The search_path stays fixed.
SET search_path = pg_catalog, webhooks, pg_temp
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
GRANT EXECUTE ON FUNCTION webhooks.enqueue(bigint, text, jsonb, text, text, integer, text, jsonb, text, integer, timestamp with time zone, text, timestamp with time zone) TO webhooks_producer;

-- PL/pgSQL for its plan kept by the session: PostgreSQL does not inline this SQL (a sub-select),
-- so as a SQL function it was planned again in every statement that called it (each publish).
CREATE OR REPLACE FUNCTION webhooks.subscribes(p_event_types text[], p_event_type text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM unnest(p_event_types) AS t
        WHERE t = '*' OR t = p_event_type
           OR (t LIKE '%.*' AND starts_with(p_event_type, left(t, -1))));
END;
$$;

CREATE OR REPLACE FUNCTION webhooks.fan_out(
    p_event_type text,
    p_payload    jsonb,
    p_event_key  text DEFAULT NULL,
    p_source_ref text DEFAULT NULL,
    p_priority   integer DEFAULT 0,
    -- for operational events: never to this endpoint, and only to explicit subscribers ('*' is not)
    p_exclude_webhook_id bigint  DEFAULT NULL,
    p_explicit_only      boolean DEFAULT false,
    -- for operational events: only to this tenant's endpoints and those marked operational_all_tenants
    p_tenant_id          bigint  DEFAULT NULL,
    -- for producers' events (publish): kept for disabled subscribers when no enabled one subscribes
    p_keep_for_disabled  boolean DEFAULT false
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
      AND (p_tenant_id IS NULL OR e.tenant_id = p_tenant_id OR e.operational_all_tenants)
      AND webhooks.subscribes(CASE WHEN p_explicit_only THEN array_remove(e.event_types, '*')
                                   ELSE e.event_types END, p_event_type)
    ORDER BY e.id
    ON CONFLICT (webhook_id, idempotency_key) DO NOTHING;
    GET DIAGNOSTICS v_queued = ROW_COUNT;
    IF p_keep_for_disabled THEN
        SELECT v_queued + count(*) INTO v_queued
        FROM webhooks.keep_for_disabled(webhooks.disabled_subscribers(p_event_type), v_event_id, p_event_type,
                                        p_payload, p_source_ref, p_priority);
    END IF;
    RETURN v_queued;
END;
$$;

-- A message whose only subscribers are disabled is not dropped: each of them gets a row,
-- dead-lettered at once with category 'disabled' (no attempt is made: disabled endpoints get no
-- new deliveries), replayed like any dead letter once the endpoint is enabled. A message that
-- reaches an enabled endpoint gives the disabled ones nothing. This is who they are: the disabled
-- subscribers (of the tenant, when given) when no enabled endpoint subscribes, else none.
CREATE OR REPLACE FUNCTION webhooks.disabled_subscribers(p_event_type text, p_tenant_id bigint DEFAULT NULL)
RETURNS bigint[]
LANGUAGE sql STABLE
AS $$
    SELECT coalesce(array_agg(e.id ORDER BY e.id), '{}')
    FROM webhooks.endpoints e
    WHERE NOT e.active AND webhooks.subscribes(e.event_types, p_event_type)
      AND (p_tenant_id IS NULL OR e.tenant_id = p_tenant_id)
      AND NOT EXISTS (SELECT 1 FROM webhooks.endpoints a
                      WHERE a.active AND webhooks.subscribes(a.event_types, p_event_type)
                        AND (p_tenant_id IS NULL OR a.tenant_id = p_tenant_id));
$$;

-- The rows that keep a message for these (disabled) endpoints, dead-lettered; the ids it made.
CREATE OR REPLACE FUNCTION webhooks.keep_for_disabled(
    p_webhook_ids  bigint[],
    p_event_id     text,
    p_event_type   text,
    p_payload      jsonb,
    p_source_ref   text        DEFAULT NULL,
    p_priority     integer     DEFAULT 0,
    p_ordering_key text        DEFAULT NULL,
    p_traceparent  text        DEFAULT NULL,
    p_expires_at   timestamptz DEFAULT NULL
) RETURNS SETOF bigint
LANGUAGE sql
SET jit = off
AS $$
    INSERT INTO webhooks.alert_delivery_queue AS q
        (webhook_id, event_id, idempotency_key, event_type, payload, source_ref, priority, ordering_key,
         traceparent, expires_at, status, dead_lettered_at, failure_category, dead_letter_reason)
    SELECT t.id, p_event_id, p_event_id, p_event_type, p_payload, p_source_ref, p_priority, p_ordering_key,
           p_traceparent, p_expires_at, 'dead_letter', now(), 'disabled',
           'endpoint disabled: published while every subscriber was disabled; replay it once enabled'
    FROM unnest(p_webhook_ids) AS t(id) ORDER BY t.id
    ON CONFLICT (webhook_id, idempotency_key) DO NOTHING
    RETURNING q.delivery_id;
$$;

CREATE OR REPLACE FUNCTION webhooks.publish(
    p_event_type text,
    p_payload    jsonb,
    p_event_key  text DEFAULT NULL,
    p_source_ref text DEFAULT NULL,
    p_priority   integer DEFAULT 0
) RETURNS integer
LANGUAGE plpgsql
SET jit = off
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    IF starts_with(p_event_type, 'webhook.') THEN
        RAISE EXCEPTION 'event type % is reserved: types starting with ''webhook.'' are the worker''s own '
                        'operational events', p_event_type
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN webhooks.fan_out(p_event_type, p_payload, p_event_key, p_source_ref, p_priority,
                            p_keep_for_disabled => true);
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.publish(text, jsonb, text, text, integer) TO webhooks_producer;

CREATE OR REPLACE FUNCTION webhooks.observer_queue_alert() RETURNS trigger
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
GRANT EXECUTE ON FUNCTION webhooks.observer_queue_alert() TO webhooks_producer;

-- Every delivery as the queue's rows read before their messages were stored apart: the queue's
-- columns, with the payload, metadata and source_ref of the row's message. (A row that never got
-- a message, inserted with the triggers off, shows its own.) Read this, not the queue table, for a
-- row's payload.
CREATE OR REPLACE VIEW webhooks.deliveries AS
SELECT q.delivery_id, q.webhook_id, q.event_id, q.idempotency_key, q.event_type,
       coalesce(m.payload, q.payload) AS payload,
       coalesce(m.source_ref, q.source_ref) AS source_ref,
       coalesce(m.metadata, q.metadata) AS metadata,
       q.status, q.priority, q.ordering_key, q.attempts, q.deferrals, q.replays, q.max_attempts,
       q.next_retry_at, q.locked_by, q.lease_token, q.locked_until, q.last_http_status, q.last_error,
       q.failure_category, q.dead_letter_reason, q.traceparent, q.expires_at, q.created_at,
       q.scheduled_at, q.updated_at, q.delivered_at, q.dead_lettered_at, q.digest_id, q.tenant_id,
       q.message_id
FROM webhooks.alert_delivery_queue q
LEFT JOIN webhooks.messages m ON m.message_id = q.message_id
-- a view runs as its owner, whom row-level security does not bind: it applies the tenant itself
WHERE (SELECT webhooks.caller_tenant()) IS NULL OR q.tenant_id = (SELECT webhooks.caller_tenant());
GRANT SELECT ON webhooks.deliveries TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;
