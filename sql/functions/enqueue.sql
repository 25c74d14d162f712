-- enqueue: the ways in. A plain INSERT into webhooks.alert_delivery_queue, webhooks.enqueue() (the
-- idempotent way for producers that may retry), webhooks.publish() (one event, one delivery per
-- subscribed endpoint; publish_many() for many at once), and webhooks.observer_queue_alert(), the
-- trigger an application attaches to its own table:
--   CREATE TRIGGER alerts_webhooks AFTER INSERT ON alerts FOR EACH ROW
--       EXECUTE FUNCTION webhooks.observer_queue_alert('alert.created', 'id');
-- (arguments: the event type, or 'column:<name>' to read it from the row; optionally the column
-- holding a stable event key; the payload is the row as JSON), or, for statements of many rows:
--   CREATE TRIGGER alerts_webhooks AFTER INSERT ON alerts REFERENCING NEW TABLE AS webhooks_new
--       FOR EACH STATEMENT EXECUTE FUNCTION webhooks.observer_queue_alert('alert.created', 'id');
-- A table trigger (functions/triggers.sql) does the same with updates and deletes, without writing
-- a trigger by hand.
--
-- Every function that queues (these, the API's publish, test events, replays, operational events)
-- does it through one gate, webhooks.queue_deliveries() below, which applies the tenant, quota,
-- disabled-endpoint and reserved-type rules once, for a set of requests at a time.
--
-- Every row passes through the queue's insert triggers, the gate's row step: fill_idempotency_key()
-- sets the row's tenant from its endpoint (never from the producer), bounds the payload,
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
-- Its lookups (the queue by endpoint and key, the messages by tenant and event) are planned once per
-- session and run once per row. Planned from statistics that say the queue is empty while it is not
-- (an ANALYZE, autovacuum's too, that ran during a bulk INSERT, or on an emptied table), they would
-- read the whole table for each row: an INSERT of n rows would cost n² and a large one never end.
-- The indexes answer them whatever the statistics say. (A plan that must still read a table, the
-- one-row config, costs so much then that JIT would compile it for each row: off.)
SET enable_seqscan = off
SET jit = off
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

-- The gate: every function that queues a delivery (enqueue, publish, publish_many and the trigger
-- observer_queue_alert, table triggers, the API's publish and batch, test events, replays one and
-- bulk, operational events) calls queue_deliveries(), the only function that inserts into the queue or puts a row back
-- in it; tests/integration/test_gate.py reads every function's source to hold it so. It applies,
-- once, for a whole set of requests at a time (a statement-level trigger with a transition table
-- passes its rows in one call):
--
-- * the caller's tenant (caller_tenant()): an endpoint of another tenant is answered as a missing
--   one, and a fan-out reaches the caller's tenant only. The worker's own events name theirs, and
--   so do a table trigger's (p_caller 'trigger', functions/triggers.sql): a request's tenant_id is
--   its audience, that tenant's subscribers alone, whatever the writing session's tenant.
-- * the tenant's max_queued, for the API's callers (p_caller 'api', and 'test': a test event is an
--   operator's, never a producer's): a request that would take the tenant past it is refused
--   (SQLSTATE 53400) and queues nothing. Requests are taken in their order: from the first that
--   does not fit, every later one is refused too (constraint tenant_queue_full), so what a caller
--   sends again comes after what was queued. One that needs more rows than max_queued itself can
--   never fit (constraint tenant_quota_too_small) and stops nothing after it. An idempotency key
--   already queued needs no room. Producers writing SQL ('producer', and their tables' triggers,
--   'trigger') and the worker ('worker', 'operator') are never refused: their rows wait under the
--   tenant's rate limit.
-- * disabled endpoints: a fan-out skips them; a row addressed to one is queued and waits (until
--   expire_disabled_endpoint_rows() dead-letters it once its retry window has passed); a message
--   (one request within one tenant) none of whose subscribers is enabled is kept for the disabled
--   ones as dead letters, category 'disabled', no attempt made, replayable once enabled; a test
--   event to a disabled endpoint is refused (SQLSTATE 55000).
-- * test events: at most TEST_EVENTS_PER_MINUTE (10) per endpoint in any minute, fleet-wide
--   (webhooks.test_event_sends); the next is refused with SQLSTATE WHT29, its DETAIL the seconds
--   until one may be sent (the API's and the console's Retry-After).
-- * the catalogue's reserved types: 'webhook.*' only from the worker and test events. (Payloads are
--   checked against the catalogue's JSON Schemas by the API, which names the catalogue's version
--   in the same statement: api_publish_begin().)
-- * the bounds, and the tenant and message of each row: the queue's insert trigger
--   fill_idempotency_key(), the gate's row step, which a producer's own INSERT passes too (a plain
--   INSERT addresses one endpoint as a SQL producer: no rule above but those applies to it).
--
-- A request with a dead_letter_category is queued as a dead letter at once, with that category and
-- its dead_letter_reason, as a message none of whose subscribers is enabled is (no attempt made;
-- replayable): a table's row that cannot be sent, too large or naming no known tenant.
--
-- p_replays: dead letters and delivered rows to put back to pending (attempts and deferrals reset,
-- replays counted, the same key, audited), the caller's tenant's only; a deleted endpoint's rows are
-- history and stay. Answered as created rows without an ordinal.
--
-- Answers one row per delivery queued or found by its key (created false), with the request's
-- ordinal, and one row per request refused for the quota (its SQLSTATE, constraint and message);
-- a call of one request raises that refusal instead. For the API, a key found with another event
-- type or payload is refused (SQLSTATE 23505, constraint idempotency_key_reused).
-- Runs as the owner and is granted to nobody: the functions above are its callers.
CREATE OR REPLACE FUNCTION webhooks.queue_deliveries(
    p_requests webhooks.delivery_request[],
    p_caller   text,
    p_replays  bigint[] DEFAULT NULL
) RETURNS TABLE (ordinal integer, webhook_id bigint, delivery_id bigint, created boolean,
                 refused_sqlstate text, refused_constraint text, refused_message text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
-- Short OLTP statements: JIT compilation would cost far more than it saves.
SET jit = off
-- Its statements read arrays given as parameters; with custom plans PostgreSQL planned them again
-- on every call. The generic plans reach the queue by its indexes whatever its size, and whatever its
-- statistics say (planned while they said it was empty, a key already queued would be looked for
-- by reading the whole queue, for each of a bulk statement's rows): see fill_idempotency_key().
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    -- the test events' rate: written here alone (the API, the console and the CLI answer its refusal)
    TEST_EVENTS_PER_MINUTE CONSTANT integer := 10;
    v_tenant    bigint := webhooks.caller_tenant();
    v_event_ids text[];
    v_count     integer := coalesce(cardinality(p_requests), 0);
    -- the targets: request index (in p_requests), endpoint, its tenant, kept as a dead letter
    v_req       integer[];
    v_hook      bigint[];
    v_hook_tenant bigint[];
    v_kept      boolean[];
    v_refused   integer[] := '{}';
    v_ins_hook  bigint[];
    v_ins_key   text[];
    v_ins_id    bigint[];
    v_row       record;
    v_sent      timestamptz[];
    v_reserved  text;
    v_foreign   bigint;
    v_quota     boolean;
    v_found     bigint;
    v_next      integer;  -- the next row the insert returned
    v_j         integer;
    v_key       text;
    v_one       webhooks.delivery_request;  -- the request, when there is one
BEGIN
    IF p_caller IS NULL OR p_caller NOT IN ('producer', 'api', 'test', 'worker', 'operator', 'trigger') THEN
        RAISE EXCEPTION 'queue_deliveries: unknown caller %', p_caller USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF p_replays IS NOT NULL THEN
        RETURN QUERY
        WITH replayed AS (
            UPDATE webhooks.alert_delivery_queue q
            SET status = 'pending', attempts = 0, deferrals = 0, replays = q.replays + 1,
                next_retry_at = now(), dead_letter_reason = NULL, dead_lettered_at = NULL,
                delivered_at = NULL, scheduled_at = now(), updated_at = now(),
                -- an expired row replayed on purpose is meant to be sent now
                expires_at = CASE WHEN q.failure_category = 'expired' THEN NULL ELSE q.expires_at END,
                -- a replayed row comes back on its own, never into the digest it was in
                digest_id = NULL
            WHERE q.delivery_id = ANY (p_replays) AND q.status IN ('dead_letter', 'delivered')
              AND (v_tenant IS NULL OR q.tenant_id = v_tenant)
              -- a deleted endpoint's rows are history: nothing would send them
              AND EXISTS (SELECT 1 FROM webhooks.endpoints e WHERE e.id = q.webhook_id)
            RETURNING q.delivery_id, q.webhook_id, q.replays, q.tenant_id
        ), logged AS (
            INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome, error, tenant_id)
            SELECT r.delivery_id, r.webhook_id, 0, 'replayed', 'replay ' || r.replays, r.tenant_id FROM replayed r
            RETURNING 1
        )
        -- (a data-modifying WITH runs to completion whether or not it is read)
        SELECT NULL::integer, r.webhook_id, r.delivery_id, true, NULL::text, NULL::text, NULL::text
        FROM replayed r;
    END IF;
    IF v_count = 0 THEN
        RETURN;
    END IF;

    -- An event id per request (for every delivery it makes), a reserved type, an endpoint outside
    -- the caller's tenant, and, when every request addresses its endpoint, the targets themselves:
    -- for one request (the usual call) in expressions, for more in one pass over them.
    IF v_count = 1 THEN
        v_one := p_requests[1];
        v_event_ids := ARRAY[coalesce(v_one.event_id, 'evt_' || replace(gen_random_uuid()::text, '-', ''))];
        IF starts_with(v_one.event_type, 'webhook.') THEN
            v_reserved := v_one.event_type;
        END IF;
        IF v_one.webhook_id IS NOT NULL THEN
            v_req := '{1}';
            v_hook := ARRAY[v_one.webhook_id];
            IF v_tenant IS NOT NULL AND NOT EXISTS (SELECT 1 FROM webhooks.endpoints e
                                                    WHERE e.id = v_hook[1] AND e.tenant_id = v_tenant) THEN
                v_foreign := v_hook[1];
            END IF;
        END IF;
    ELSE
        SELECT array_agg(coalesce(r.event_id, 'evt_' || replace(gen_random_uuid()::text, '-', '')) ORDER BY r.i),
               min(r.event_type) FILTER (WHERE starts_with(r.event_type, 'webhook.')),
               min(r.webhook_id) FILTER (WHERE v_tenant IS NOT NULL AND r.webhook_id IS NOT NULL
                                           AND NOT EXISTS (SELECT 1 FROM webhooks.endpoints e
                                                           WHERE e.id = r.webhook_id AND e.tenant_id = v_tenant)),
               CASE WHEN bool_and(r.webhook_id IS NOT NULL) THEN array_agg(r.i::integer ORDER BY r.i) END,
               CASE WHEN bool_and(r.webhook_id IS NOT NULL) THEN array_agg(r.webhook_id ORDER BY r.i) END
        INTO v_event_ids, v_reserved, v_foreign, v_req, v_hook
        FROM unnest(p_requests) WITH ORDINALITY AS r(ordinal, webhook_id, event_type, event_id, idempotency_key,
                                                    payload, metadata, source_ref, priority, ordering_key,
                                                    max_attempts, deliver_at, traceparent, expires_at,
                                                    tenant_id, exclude_webhook_id, dead_letter_category,
                                                    dead_letter_reason, i);
    END IF;

    -- the catalogue's reserved types: the API's callers never, a producer only holding the owner's
    -- rights (as for its own INSERT: refuse_reserved_event_type()); this runs as the owner, so the
    -- acting role is the one the session set, or its login
    IF v_reserved IS NOT NULL AND (p_caller IN ('api', 'trigger') OR (p_caller = 'producer' AND NOT pg_has_role(
            CASE WHEN current_setting('role') = 'none' THEN session_user ELSE current_setting('role') END,
            (SELECT c.relowner FROM pg_class c WHERE c.oid = 'webhooks.alert_delivery_queue'::regclass),
            'USAGE'))) THEN
        RAISE EXCEPTION 'event type % is reserved: types starting with ''webhook.'' are the worker''s own '
                        'operational events', v_reserved
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- the caller's tenant: another tenant's endpoint is a missing one (with none set, the row step
    -- refuses an endpoint that does not exist, as a foreign key would)
    IF v_foreign IS NOT NULL THEN
        RAISE EXCEPTION 'webhook_id %: no such endpoint', v_foreign USING ERRCODE = 'foreign_key_violation';
    END IF;

    IF p_caller = 'test' THEN
        FOR v_row IN SELECT DISTINCT e.id, e.name, e.active FROM unnest(p_requests) r
                     JOIN webhooks.endpoints e ON e.id = r.webhook_id ORDER BY e.id LOOP
            IF NOT v_row.active THEN
                RAISE EXCEPTION 'endpoint %: the endpoint is disabled; enable it to send it a test event', v_row.name
                    USING ERRCODE = 'object_not_in_prerequisite_state';
            END IF;
            INSERT INTO webhooks.test_event_sends AS s (webhook_id, sent_at) VALUES (v_row.id, '{}')
            ON CONFLICT ON CONSTRAINT test_event_sends_pkey DO NOTHING;
            SELECT ARRAY(SELECT t FROM unnest(s.sent_at) t WHERE t > now() - interval '1 minute' ORDER BY t)
            INTO v_sent FROM webhooks.test_event_sends s WHERE s.webhook_id = v_row.id FOR UPDATE;
            IF cardinality(v_sent) >= TEST_EVENTS_PER_MINUTE THEN
                RAISE EXCEPTION 'endpoint %: at most % test events a minute', v_row.name, TEST_EVENTS_PER_MINUTE
                    USING ERRCODE = 'WHT29',
                          DETAIL = greatest(1, ceil(extract(epoch FROM v_sent[1] + interval '1 minute' - now())))::text;
            END IF;
            UPDATE webhooks.test_event_sends s SET sent_at = v_sent || now() WHERE s.webhook_id = v_row.id;
        END LOOP;
    END IF;

    -- The targets: the endpoint a request addresses (enabled or not: its row waits), or each
    -- enabled subscriber in the audience, or, where a tenant has none for the request, its disabled
    -- ones, kept as dead letters. '*' does not subscribe to the worker's own 'webhook.*' types.
    v_quota := false;
    IF p_caller IN ('api', 'test') THEN
        v_quota := EXISTS (SELECT 1 FROM webhooks.tenants t WHERE t.max_queued IS NOT NULL);
    END IF;
    IF v_hook IS NOT NULL THEN
        -- every request addresses its endpoint: those are the targets
        v_kept := array_fill(false, ARRAY[cardinality(v_hook)]);
        IF v_quota THEN
            v_hook_tenant := ARRAY(SELECT e.tenant_id FROM unnest(v_hook) WITH ORDINALITY AS t(id, n)
                                   LEFT JOIN webhooks.endpoints e ON e.id = t.id ORDER BY t.n);
        END IF;
    ELSIF v_count = 1 THEN
        -- one event to its subscribers (the usual publish): one read of the endpoints
        SELECT coalesce(array_agg(e.id ORDER BY e.id), '{}'), coalesce(array_agg(e.tenant_id ORDER BY e.id), '{}'),
               coalesce(array_agg(NOT e.active ORDER BY e.id), '{}')
        INTO v_hook, v_hook_tenant, v_kept
        FROM webhooks.endpoints e
        WHERE e.id IS DISTINCT FROM v_one.exclude_webhook_id
          AND CASE WHEN p_caller = 'trigger' THEN e.tenant_id = v_one.tenant_id
                   WHEN p_caller = 'worker' AND v_one.tenant_id IS NOT NULL
                   THEN e.tenant_id = v_one.tenant_id OR e.operational_all_tenants
                   ELSE v_tenant IS NULL OR e.tenant_id = v_tenant END
          AND webhooks.subscribes(CASE WHEN v_reserved IS NOT NULL THEN array_remove(e.event_types, '*')
                                       ELSE e.event_types END, v_one.event_type);
        IF true = ANY (v_kept) THEN
            -- a disabled subscriber keeps it only where its tenant has no enabled one
            SELECT coalesce(array_agg(t.id ORDER BY t.id), '{}'), coalesce(array_agg(t.tenant_id ORDER BY t.id), '{}'),
                   coalesce(array_agg(t.kept ORDER BY t.id), '{}')
            INTO v_hook, v_hook_tenant, v_kept
            FROM unnest(v_hook, v_hook_tenant, v_kept) AS t(id, tenant_id, kept)
            WHERE NOT t.kept
               OR NOT EXISTS (SELECT 1 FROM unnest(v_hook_tenant, v_kept) AS a(tenant_id, kept)
                              WHERE a.tenant_id = t.tenant_id AND NOT a.kept);
        END IF;
        v_req := array_fill(1, ARRAY[cardinality(v_hook)]);
    ELSE
        -- many requests, some of them to subscribers: the same, for all of them at once
        SELECT coalesce(array_agg(c.i), '{}'), coalesce(array_agg(c.id), '{}'),
               coalesce(array_agg(c.tenant_id), '{}'), coalesce(array_agg(NOT c.active), '{}')
        INTO v_req, v_hook, v_hook_tenant, v_kept
        FROM (
            SELECT t.i, t.id, t.tenant_id, t.active
            FROM (
                SELECT u.i, u.id, u.tenant_id, u.active,
                       bool_or(u.active) OVER (PARTITION BY u.i, u.tenant_id) AS any_active
                FROM (
                    SELECT r.i::integer AS i, r.webhook_id AS id, e.tenant_id, true AS active
                    FROM unnest(p_requests) WITH ORDINALITY AS r(ordinal, webhook_id, event_type, event_id,
                                                                idempotency_key, payload, metadata, source_ref,
                                                                priority, ordering_key, max_attempts, deliver_at,
                                                                traceparent, expires_at, tenant_id,
                                                                exclude_webhook_id, dead_letter_category,
                                                                dead_letter_reason, i)
                    LEFT JOIN webhooks.endpoints e ON e.id = r.webhook_id
                    WHERE r.webhook_id IS NOT NULL
                    UNION ALL
                    SELECT r.i::integer, e.id, e.tenant_id, e.active
                    FROM unnest(p_requests) WITH ORDINALITY AS r(ordinal, webhook_id, event_type, event_id,
                                                                idempotency_key, payload, metadata, source_ref,
                                                                priority, ordering_key, max_attempts, deliver_at,
                                                                traceparent, expires_at, tenant_id,
                                                                exclude_webhook_id, dead_letter_category,
                                                                dead_letter_reason, i)
                    JOIN webhooks.endpoints e
                      ON r.webhook_id IS NULL
                     AND e.id IS DISTINCT FROM r.exclude_webhook_id
                     AND CASE WHEN p_caller = 'trigger' THEN e.tenant_id = r.tenant_id
                              WHEN p_caller = 'worker' AND r.tenant_id IS NOT NULL
                              THEN e.tenant_id = r.tenant_id OR e.operational_all_tenants
                              ELSE v_tenant IS NULL OR e.tenant_id = v_tenant END
                     AND webhooks.subscribes(CASE WHEN starts_with(r.event_type, 'webhook.')
                                                  THEN array_remove(e.event_types, '*') ELSE e.event_types END,
                                             r.event_type)
                ) u
            ) t
            WHERE t.active OR NOT t.any_active
            ORDER BY t.i, t.id
        ) c;
    END IF;

    -- The quota, for the API's callers. Most deployments set none: then nothing to count.
    IF v_quota THEN
        FOR v_row IN
            WITH need AS (
                -- rows each request would add per tenant with a quota: not kept, no key already queued
                SELECT t.i, t.tenant_id, count(*) AS rows
                FROM unnest(v_req, v_hook, v_hook_tenant, v_kept) AS t(i, webhook_id, tenant_id, kept)
                WHERE NOT t.kept
                  AND NOT EXISTS (SELECT 1 FROM webhooks.alert_delivery_queue q
                                  WHERE q.webhook_id = t.webhook_id
                                    AND q.idempotency_key = coalesce((p_requests[t.i]).idempotency_key, v_event_ids[t.i]))
                GROUP BY t.i, t.tenant_id
            ), room AS (
                SELECT n.tenant_id, tn.name, tn.max_queued,
                       tn.max_queued - (SELECT count(*) FROM (SELECT 1 FROM webhooks.alert_delivery_queue q
                                                              WHERE q.tenant_id = n.tenant_id
                                                                AND q.status IN ('pending', 'retrying', 'delivering')
                                                              LIMIT tn.max_queued) x) AS free
                FROM (SELECT DISTINCT need.tenant_id FROM need) n
                JOIN webhooks.tenants tn ON tn.id = n.tenant_id AND tn.max_queued IS NOT NULL
            ), judged AS (
                SELECT n.i, m.name, m.max_queued, m.free, n.rows, n.rows > m.max_queued AS never,
                       sum(CASE WHEN n.rows > m.max_queued THEN 0 ELSE n.rows END)
                           OVER (PARTITION BY n.tenant_id ORDER BY n.i) > m.free AS over
                FROM need n JOIN room m ON m.tenant_id = n.tenant_id
            ), first_over AS (
                SELECT min(j.i) AS i FROM judged j WHERE j.over AND NOT j.never
            )
            SELECT j.i, bool_or(j.never) AS never, min(j.name) AS name, min(j.max_queued) AS max_queued,
                   min(greatest(j.free, 0)) AS free, max(j.rows) AS rows
            FROM judged j, first_over f
            WHERE j.never OR j.i >= f.i
            GROUP BY j.i
            UNION
            -- every request after the first that did not fit, whatever its tenant
            SELECT x.i::integer, false, NULL, NULL, NULL, NULL
            FROM generate_subscripts(p_requests, 1) AS x(i), first_over f
            WHERE x.i > f.i AND NOT EXISTS (SELECT 1 FROM judged j WHERE j.i = x.i AND j.never)
            ORDER BY 1, 2 DESC, 3 NULLS LAST
        LOOP
            CONTINUE WHEN v_row.i = ANY (v_refused);
            v_refused := v_refused || v_row.i;
            ordinal := (p_requests[v_row.i]).ordinal;
            webhook_id := NULL; delivery_id := NULL; created := NULL;
            refused_sqlstate := '53400';
            IF v_row.never THEN
                refused_constraint := 'tenant_quota_too_small';
                refused_message := format('tenant %s: the message needs %s queued deliveries, more than the '
                                          'tenant''s max_queued of %s: it can never be queued', v_row.name,
                                          v_row.rows, v_row.max_queued);
            ELSIF v_row.name IS NULL THEN
                refused_constraint := 'tenant_queue_full';
                refused_message := 'not queued: an earlier message found its tenant at its quota of queued '
                                   'deliveries; send it again after those';
            ELSE
                refused_constraint := 'tenant_queue_full';
                refused_message := format('tenant %s: at its quota of %s queued deliveries (%s free, the message '
                                          'needs %s)', v_row.name, v_row.max_queued, v_row.free, v_row.rows);
            END IF;
            IF v_count = 1 THEN
                -- the call's only request: nothing else to go on with
                RAISE EXCEPTION USING ERRCODE = refused_sqlstate, MESSAGE = refused_message,
                                      CONSTRAINT = refused_constraint;
            END IF;
            RETURN NEXT;
        END LOOP;
    END IF;

    -- The rows, in the targets' order (endpoint by endpoint within a request), but those of a
    -- refused request. A key the endpoint already has makes none (ON CONFLICT DO NOTHING).
    WITH inserted AS (
        INSERT INTO webhooks.alert_delivery_queue AS q
            (webhook_id, event_id, idempotency_key, event_type, payload, metadata, source_ref, priority,
             ordering_key, max_attempts, next_retry_at, traceparent, expires_at, status, dead_lettered_at,
             failure_category, dead_letter_reason)
        SELECT t.webhook_id, v_event_ids[t.i], coalesce((p_requests[t.i]).idempotency_key, v_event_ids[t.i]),
               (p_requests[t.i]).event_type, (p_requests[t.i]).payload,
               coalesce((p_requests[t.i]).metadata, '{}'), (p_requests[t.i]).source_ref,
               coalesce((p_requests[t.i]).priority, 0), (p_requests[t.i]).ordering_key,
               (p_requests[t.i]).max_attempts, coalesce((p_requests[t.i]).deliver_at, now()),
               (p_requests[t.i]).traceparent, (p_requests[t.i]).expires_at,
               CASE WHEN t.kept OR (p_requests[t.i]).dead_letter_category IS NOT NULL THEN 'dead_letter'
                    ELSE 'pending' END,
               CASE WHEN t.kept OR (p_requests[t.i]).dead_letter_category IS NOT NULL THEN now() END,
               coalesce((p_requests[t.i]).dead_letter_category, CASE WHEN t.kept THEN 'disabled' END),
               coalesce((p_requests[t.i]).dead_letter_reason,
                        CASE WHEN t.kept THEN 'endpoint disabled: published while every subscriber was '
                                              'disabled; replay it once enabled' END)
        FROM unnest(v_req, v_hook, v_kept) AS t(i, webhook_id, kept)
        WHERE NOT t.i = ANY (v_refused)
        ON CONFLICT (webhook_id, idempotency_key) DO NOTHING
        RETURNING q.webhook_id, q.idempotency_key, q.delivery_id
    )
    SELECT array_agg(i.webhook_id), array_agg(i.idempotency_key), array_agg(i.delivery_id)
    INTO v_ins_hook, v_ins_key, v_ins_id
    FROM inserted i;

    -- The answer, target by target: the row made now (the insert returns them in the targets' order)
    -- or, for a key the endpoint already had, the row found. That one is found by both columns of
    -- the (webhook_id, idempotency_key) index, by a statement with a snapshot of its own: a
    -- concurrent insert of the same key that won (ON CONFLICT waited for it to commit) is visible to
    -- it, where it was not in the insert's.
    v_next := 1;
    FOR v_j IN 1 .. coalesce(cardinality(v_req), 0) LOOP
        CONTINUE WHEN v_req[v_j] = ANY (v_refused);
        v_key := coalesce((p_requests[v_req[v_j]]).idempotency_key, v_event_ids[v_req[v_j]]);
        ordinal := (p_requests[v_req[v_j]]).ordinal;
        webhook_id := v_hook[v_j];
        refused_sqlstate := NULL; refused_constraint := NULL; refused_message := NULL;
        IF v_next <= cardinality(v_ins_id) AND v_ins_hook[v_next] = v_hook[v_j] AND v_ins_key[v_next] = v_key THEN
            delivery_id := v_ins_id[v_next];
            created := true;
            v_next := v_next + 1;
        ELSE
            SELECT q.delivery_id INTO v_found FROM webhooks.alert_delivery_queue q
            WHERE q.webhook_id = v_hook[v_j] AND q.idempotency_key = v_key;
            CONTINUE WHEN v_found IS NULL;
            -- made by this call: the insert's ids ascend, so one below the first is not (and a
            -- bulk statement sent again, found row after row, costs no search of them)
            created := coalesce(v_found >= v_ins_id[1] AND v_found = ANY (v_ins_id), false);
            -- Over the API, the same key for another message (another event type or payload) is
            -- refused, as an idempotency key reused with other parameters is elsewhere: answered
            -- with the old deliveries, the new message would be lost without a word.
            IF NOT created AND p_caller = 'api' AND EXISTS (
                    SELECT 1 FROM webhooks.alert_delivery_queue q
                    LEFT JOIN webhooks.messages m ON m.message_id = q.message_id
                    WHERE q.delivery_id = v_found
                      AND (q.event_type IS DISTINCT FROM (p_requests[v_req[v_j]]).event_type
                           OR coalesce(m.payload, q.payload) IS DISTINCT FROM (p_requests[v_req[v_j]]).payload)) THEN
                RAISE EXCEPTION 'idempotency key % was used for another message (another event type or payload)',
                                v_key
                    USING ERRCODE = 'unique_violation', CONSTRAINT = 'idempotency_key_reused';
            END IF;
            delivery_id := v_found;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

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
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_id bigint;
BEGIN
    SELECT g.delivery_id INTO v_id
    FROM webhooks.queue_deliveries(
        ARRAY[ROW(1, p_webhook_id, p_event_type, p_event_id, p_idempotency_key, p_payload, p_metadata,
                  p_source_ref, p_priority, p_ordering_key, p_max_attempts, p_deliver_at, p_traceparent,
                  p_expires_at, NULL, NULL, NULL, NULL)::webhooks.delivery_request], 'producer') g;
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

-- The event id of a published event: given a stable key, derived from it (a producer that publishes
-- again queues nothing twice), else a new one.
CREATE OR REPLACE FUNCTION webhooks.published_event_id(p_event_type text, p_event_key text) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT CASE WHEN p_event_key IS NULL THEN 'evt_' || replace(gen_random_uuid()::text, '-', '')
                ELSE 'evt_' || md5(p_event_type || ':' || p_event_key) END;
$$;

-- One event to every subscribed endpoint (the gate's fan-out); the count of rows it made.
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
DECLARE
    v_event_id text := webhooks.published_event_id(p_event_type, p_event_key);
BEGIN
    RETURN (SELECT count(*) FILTER (WHERE g.created)
            FROM webhooks.queue_deliveries(
                ARRAY[ROW(1, NULL, p_event_type, v_event_id, v_event_id, p_payload, NULL, p_source_ref,
                          p_priority, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::webhooks.delivery_request],
                'producer') g);
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.publish(text, jsonb, text, text, integer) TO webhooks_producer;

-- Many events at once, each to its subscribers (the gate's fan-out, one call): element i of each
-- array is one event (type, payload, optional stable key as in publish(), optional source_ref). The
-- count of rows it made. What observer_queue_alert() calls for a statement's rows.
CREATE OR REPLACE FUNCTION webhooks.publish_many(
    p_event_types text[],
    p_payloads    jsonb[],
    p_event_keys  text[] DEFAULT NULL,
    p_source_refs text[] DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql
SET jit = off
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    IF cardinality(p_event_types) IS DISTINCT FROM cardinality(p_payloads)
       OR cardinality(p_event_keys) <> cardinality(p_payloads) OR cardinality(p_source_refs) <> cardinality(p_payloads) THEN
        RAISE EXCEPTION 'publish_many: the arrays must be of the same length' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (SELECT count(*) FILTER (WHERE g.created)
            FROM webhooks.queue_deliveries(ARRAY(
                SELECT ROW(e.i, NULL, e.event_type, webhooks.published_event_id(e.event_type, e.event_key),
                           NULL, e.payload, NULL, e.source_ref, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                           NULL, NULL)::webhooks.delivery_request
                FROM unnest(p_event_types, p_payloads, p_event_keys, p_source_refs)
                     WITH ORDINALITY AS e(event_type, payload, event_key, source_ref, i)
                WHERE e.payload IS NOT NULL
                ORDER BY e.i), 'producer') g);
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.publish_many(text[], jsonb[], text[], text[]) TO webhooks_producer;

-- The trigger an application attaches to its own table (README), for each row or, declared FOR EACH
-- STATEMENT REFERENCING NEW TABLE AS webhooks_new, for all of a statement's rows in one call of the
-- gate (publish_many()): an INSERT … SELECT of many rows then costs about what inserting their
-- deliveries does, where a row trigger calls publish() once per row. It runs as whoever inserts
-- (their row is converted with their rights: a cast of theirs runs as them), who must be a member
-- of webhooks_producer. Arguments: the event type, or 'column:<name>' to read it from each row;
-- optionally the column holding a stable event key (then the event id derives from the table, the
-- column's value and the type, so a producer that inserts again queues nothing twice).
CREATE OR REPLACE FUNCTION webhooks.observer_queue_alert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_row        jsonb;
    v_event_type text := TG_ARGV[0];
    v_key        text;
    v_types      text[];
    v_rows       jsonb[];
    v_keys       text[];
    v_refs       text[];
BEGIN
    IF TG_NARGS < 1 THEN
        RAISE EXCEPTION 'webhooks.observer_queue_alert needs an event type argument';
    END IF;
    IF TG_LEVEL = 'STATEMENT' THEN
        SELECT array_agg(CASE WHEN starts_with(TG_ARGV[0], 'column:') THEN r.rw ->> substr(TG_ARGV[0], 8)
                              ELSE TG_ARGV[0] END ORDER BY r.n),
               array_agg(r.rw ORDER BY r.n),
               array_agg(CASE WHEN TG_NARGS >= 2
                              THEN TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME || ':' || (r.rw ->> TG_ARGV[1]) END
                         ORDER BY r.n),
               array_agg(TG_TABLE_NAME || coalesce(':' || (r.rw ->> coalesce(TG_ARGV[1], 'id')), '') ORDER BY r.n)
        INTO v_types, v_rows, v_keys, v_refs
        FROM (SELECT row_number() OVER () AS n, to_jsonb(t.*) AS rw FROM webhooks_new t) r;
        IF array_position(v_types, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'webhooks.observer_queue_alert: column % is missing or null', TG_ARGV[0];
        END IF;
        IF cardinality(v_rows) > 0 THEN
            PERFORM webhooks.publish_many(v_types, v_rows, v_keys, v_refs);
        END IF;
        RETURN NULL;
    END IF;
    v_row := to_jsonb(NEW);
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
