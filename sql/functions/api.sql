-- api: what the HTTP API (`webhook-worker api`) calls, besides the functions the CLI calls.
--
-- Tokens: api_token_role() answers the name and role of a usable token by its hash; a revoked or
-- expired token is refused at once, since nothing caches a positive answer.
--
-- Operations: api_replay_step() advances a bulk replay by a bounded step; the row lock taken per
-- step keeps two API processes from stepping one operation at once, and any API process resumes
-- the running ones (api_running_operations()).
--
-- Tenants: a scoped token's requests run with webhooks.tenant set (worker/store/database.py); the views
-- and row-level security keep them to their tenant, and api_publish(), which runs as the owner,
-- queues through the gate (queue_deliveries(), functions/enqueue.sql), which keeps to it
-- (caller_tenant(), functions/access.sql) and refuses a tenant over its max_queued quota (SQLSTATE
-- 53400: HTTP 429). A tenant administrator's deletions, bulk replays and
-- cancellations keep to its tenant the same way; a bulk replay it starts records the tenant, so the
-- API's runner, which steps every operation unscoped, replays that tenant's dead letters only.
--
-- Publishing: api_publish() is producers' enqueue with an answer: the deliveries it queued or, for
-- an idempotency key already used, the ones that exist, each with whether it is new. The gate
-- refuses the 'webhook.' event types to it as to publish() (it runs as the owner, so the insert
-- trigger would let them pass). api_publish_batch() publishes many, each in a subtransaction of its
-- own. The API publishes in one statement, a round trip outside any explicit transaction:
-- api_publish_as() or api_publish_batch_as() check the token, take its group role and tenant for
-- their own statement (api_publish_begin(), api_authorize()), refuse the publish if the catalogue
-- changed since the version the API checked the payloads at, and publish as that role. When the API
-- does not hold the event types' catalogue entries at the newest version it knows of, one statement
-- before it, api_publish_check(), reads the token's caller and those entries (the API checks
-- payloads against their schemas); a token revoked between the two is refused by the second.
--
-- Every function is SECURITY DEFINER with a fixed search_path, but for api_authorize(),
-- api_publish_begin() and the *_as functions that call them (PostgreSQL allows no role change
-- inside a SECURITY DEFINER function). api_publish() and api_publish_batch() are granted to webhooks_producer,
-- webhooks_admin and webhooks_tenant_admin (admin tokens publish too); api_token_role(), the token
-- checks and the *_as functions to webhooks_authenticator, which the API's login rests as; the
-- operations and endpoint deletion to webhooks_admin (the API's bulk replay runner steps operations
-- as webhooks_admin), and starting and cancelling a bulk replay and deleting an endpoint to
-- webhooks_tenant_admin too. Creating, revoking and listing tokens is the owner's (the CLI) and
-- webhooks_admin's (an unscoped admin token, /v1/tokens): an admin may do anything a token may, so
-- minting one gives it nothing new; a tenant administrator never holds them.

-- tokens --------------------------------------------------------------------------------------------

-- p_tenant: the tenant a producer, reader or tenant_admin token is scoped to (its name); NULL: every
-- tenant. A tenant_admin token must have one (api_token_tenant_admin_scoped), an admin token cannot.
CREATE FUNCTION webhooks.api_create_token(p_name text, p_role text, p_token_hash bytea,
                                          p_expires_at timestamptz DEFAULT NULL, p_tenant text DEFAULT NULL)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    INSERT INTO webhooks.api_tokens (name, role, token_hash, expires_at, tenant_id)
    VALUES (p_name, p_role, p_token_hash, p_expires_at,
            CASE WHEN p_tenant IS NOT NULL THEN webhooks.tenant_id(p_tenant) END)
    RETURNING id;
$$;

-- Whether a token was revoked now (false: no such token, or revoked before).
CREATE FUNCTION webhooks.api_revoke_token(p_name text) RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    WITH revoked AS (
        UPDATE webhooks.api_tokens SET revoked_at = now()
        WHERE name = p_name AND revoked_at IS NULL
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM revoked);
$$;

CREATE FUNCTION webhooks.api_token_list()
RETURNS TABLE (name text, role text, state text, created_at timestamptz, expires_at timestamptz,
               revoked_at timestamptz, tenant text)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT t.name, t.role,
           CASE WHEN t.revoked_at IS NOT NULL THEN 'revoked'
                WHEN t.expires_at <= now() THEN 'expired'
                ELSE 'active' END,
           t.created_at, t.expires_at, t.revoked_at, n.name
    FROM webhooks.api_tokens t LEFT JOIN webhooks.tenants n ON n.id = t.tenant_id ORDER BY t.name;
$$;

-- The name, role and tenant (NULL: every tenant) of a usable token by its hash; no row for an
-- unknown, revoked or expired one.
-- PL/pgSQL, as the functions that read a token on every publish are, for its plan kept by the
-- session: a SQL function that cannot be inlined (SECURITY DEFINER) is planned again on every call.
CREATE FUNCTION webhooks.api_token_role(p_token_hash bytea)
RETURNS TABLE (name text, role text, tenant_id bigint)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT t.name, t.role, t.tenant_id FROM webhooks.api_tokens t
    WHERE t.token_hash = p_token_hash AND t.revoked_at IS NULL
      AND (t.expires_at IS NULL OR t.expires_at > now());
END;
$$;

-- The caller a token stands for, as api_token_role() answers it (no row: unknown, revoked or
-- expired), and, when its role is one of p_roles, that role's group (webhooks_<role>) and its tenant
-- taken for the rest of the transaction, as SET LOCAL ROLE and webhooks.tenant would. A token whose
-- role is not in p_roles (or none) leaves the transaction resting as webhooks_authenticator, which
-- may publish nothing. Not SECURITY DEFINER: PostgreSQL refuses a role change inside one, and a SET
-- clause would undo it at return; so it changes only what the session's login may change itself
-- (the groups it is a member of), and names every object by its schema. The *_as functions call it
-- (through api_publish_begin()), so that a publish checks its token in its own statement.
CREATE FUNCTION webhooks.api_authorize(p_token_hash bytea, p_roles text[])
RETURNS TABLE (name text, role text, tenant_id bigint)
LANGUAGE plpgsql
AS $$
DECLARE
    v_token record;
BEGIN
    SELECT t.name, t.role, t.tenant_id INTO v_token FROM webhooks.api_token_role(p_token_hash) t;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_token.role = ANY (p_roles) THEN
        PERFORM pg_catalog.set_config('role', 'webhooks_' || v_token.role, true);
        IF v_token.tenant_id IS NOT NULL THEN
            PERFORM pg_catalog.set_config('webhooks.tenant', v_token.tenant_id::text, true);
        END IF;
    END IF;
    RETURN QUERY SELECT v_token.name, v_token.role, v_token.tenant_id;
END;
$$;

-- What a publish reads before it publishes, in one statement: the caller its token stands for
-- (name NULL: unknown, revoked or expired), the catalogue's version and its entries of the event
-- types (a JSON array of {name, description, schema, deprecated}; a type not catalogued is absent),
-- read together. A token that is not usable reads nothing of the catalogue.
CREATE FUNCTION webhooks.api_publish_check(p_token_hash bytea, p_event_types text[])
RETURNS TABLE (name text, role text, tenant_id bigint, catalogue_version bigint, event_types jsonb)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT t.name, t.role, t.tenant_id, v.version,
           CASE WHEN t.name IS NOT NULL THEN
               (SELECT coalesce(jsonb_agg(jsonb_build_object('name', e.name, 'description', e.description,
                                                             'schema', e.schema, 'deprecated', e.deprecated)),
                                '[]')
                FROM webhooks.event_types e WHERE e.name = ANY (p_event_types))
           END
    FROM webhooks.event_types_version v
    LEFT JOIN webhooks.api_token_role(p_token_hash) t ON true;
END;
$$;

-- publishing ----------------------------------------------------------------------------------------

-- One event to one endpoint (p_endpoint: its id, its name or tenant/name: endpoint_ref(); refused
-- with SQLSTATE P0002 when there is none, P0003 for a name several tenants hold) or, when it is NULL, to every endpoint subscribed to the event type,
-- through the gate (queue_deliveries(), functions/enqueue.sql) as the API's caller: the caller's
-- tenant, its max_queued (refused with SQLSTATE 53400, constraint tenant_queue_full or
-- tenant_quota_too_small), the disabled endpoints' rule and the reserved types. The idempotency key
-- (default: a new event id) is every delivery's key and event id, so publishing the same key again
-- queues nothing and answers with the existing deliveries (created = false); the same key for
-- another message (another event type or payload) is refused by the gate (SQLSTATE 23505,
-- constraint idempotency_key_reused). Nothing this call inserted is kept then.
CREATE FUNCTION webhooks.api_publish(
    p_event_type      text,
    p_payload         jsonb,
    p_endpoint        text        DEFAULT NULL,
    p_idempotency_key text        DEFAULT NULL,
    p_ordering_key    text        DEFAULT NULL,
    p_priority        integer     DEFAULT 0,
    p_expires_at      timestamptz DEFAULT NULL,
    p_traceparent     text        DEFAULT NULL
) RETURNS TABLE (delivery_id bigint, webhook_id bigint, endpoint_name text, created boolean,
                idempotency_key text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
-- the output columns share names with the queue's: in statements, a name means the column
#variable_conflict use_column
DECLARE
    v_key text := coalesce(p_idempotency_key, 'evt_' || replace(gen_random_uuid()::text, '-', ''));
    v_webhook_id bigint;
    -- a scoped token's tenant (set per transaction by the API); this function runs as the owner,
    -- whom row-level security does not bind, so it keeps to the tenant itself
    v_tenant bigint := webhooks.caller_tenant();
BEGIN
    IF p_endpoint IS NOT NULL THEN
        SELECT e.id INTO v_webhook_id FROM webhooks.endpoints e
        WHERE e.id = webhooks.endpoint_ref(p_endpoint) AND (v_tenant IS NULL OR e.tenant_id = v_tenant);
        IF v_webhook_id IS NULL THEN
            RAISE EXCEPTION 'endpoint: no endpoint with this name or id' USING ERRCODE = 'no_data_found';
        END IF;
    END IF;
    -- one request: the gate raises its refusals (a key reused for another message among them)
    RETURN QUERY
    SELECT g.delivery_id, g.webhook_id, e.name, g.created, v_key
    FROM webhooks.queue_deliveries(
        ARRAY[ROW(1, v_webhook_id, p_event_type, v_key, v_key, p_payload, NULL, NULL, p_priority,
                  p_ordering_key, NULL, NULL, p_traceparent, p_expires_at, NULL, NULL, NULL, NULL)::webhooks.delivery_request],
        'api') g
    LEFT JOIN webhooks.endpoints e ON e.id = g.webhook_id
    ORDER BY g.webhook_id;
END;
$$;

-- Many events at once (POST /v1/messages/batch), each as api_publish() takes it: p_messages is a
-- JSON array of objects with its arguments as keys (event_type, payload, endpoint,
-- idempotency_key, ordering_key, priority, expires_at; absent: the default). Each message runs in a
-- subtransaction of its own: one the database refuses (no such endpoint, a payload too large, a
-- reserved type, a key used for another message, the tenant's quota) keeps nothing and is answered
-- with one row of its SQLSTATE, constraint and message; the others go on. The messages are queued
-- in their order while they fit in their tenants' max_queued: from the first that does not
-- (tenant_queue_full), every later one is refused too, untried, so that what the producer sends
-- again comes after what was queued; one that can never fit (tenant_quota_too_small) is refused
-- alone. Any other error refuses the whole batch. One row per delivery, `ordinal` the message's
-- place in p_messages (from 1); a message that reached no endpoint has no row.
CREATE FUNCTION webhooks.api_publish_batch(p_messages jsonb, p_traceparent text DEFAULT NULL)
RETURNS TABLE (ordinal integer, delivery_id bigint, webhook_id bigint, endpoint_name text, created boolean,
               idempotency_key text, refused_sqlstate text, refused_constraint text, refused_message text)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_message jsonb;
    v_ordinal integer := 0;
    v_state text;
    v_constraint text;
    v_text text;
    v_full text;  -- the refusal of the first message that found its tenant's queue full
BEGIN
    -- a tenant administrator's session without its tenant is refused here, not as each message's
    -- refusal (api_publish() keeps to the caller's tenant through it)
    PERFORM webhooks.caller_tenant();
    FOR v_message IN SELECT m.value FROM jsonb_array_elements(p_messages) AS m LOOP
        v_ordinal := v_ordinal + 1;
        IF v_full IS NOT NULL THEN
            RETURN QUERY SELECT v_ordinal, NULL::bigint, NULL::bigint, NULL::text, NULL::boolean, NULL::text,
                                '53400'::text, 'tenant_queue_full'::text,
                                'not queued: an earlier message of the batch found its tenant at its quota of '
                                'queued deliveries (' || v_full || '); send it again after those';
            CONTINUE;
        END IF;
        BEGIN
            -- api_publish() answers all its rows or raises before the first: a refused message
            -- adds no row here, and its subtransaction keeps nothing
            RETURN QUERY
            SELECT v_ordinal, p.delivery_id, p.webhook_id, p.endpoint_name, p.created, p.idempotency_key,
                   NULL::text, NULL::text, NULL::text
            FROM webhooks.api_publish(v_message->>'event_type', v_message->'payload', v_message->>'endpoint',
                                      v_message->>'idempotency_key', v_message->>'ordering_key',
                                      coalesce((v_message->>'priority')::integer, 0),
                                      (v_message->>'expires_at')::timestamptz, p_traceparent) AS p;
        EXCEPTION WHEN no_data_found OR program_limit_exceeded OR insufficient_privilege
                       OR unique_violation OR too_many_rows OR configuration_limit_exceeded THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_constraint = CONSTRAINT_NAME,
                                    v_text = MESSAGE_TEXT;
            IF v_state = '23505' AND v_constraint IS DISTINCT FROM 'idempotency_key_reused' THEN
                RAISE;  -- not a key reused for another message: no refusal of this message alone
            END IF;
            IF v_state = '53400' AND v_constraint = 'tenant_queue_full' THEN
                v_full := v_text;
            END IF;
            RETURN QUERY SELECT v_ordinal, NULL::bigint, NULL::bigint, NULL::text, NULL::boolean, NULL::text,
                                v_state, nullif(v_constraint, ''), v_text;
        END;
    END LOOP;
END;
$$;

-- api_publish() and api_publish_batch() under a token (the API's publish, one statement each),
-- after api_publish_begin(). Not SECURITY DEFINER, for api_authorize()'s sake: what they publish,
-- they publish as the token's group role, through the functions granted to it.
CREATE FUNCTION webhooks.api_publish_as(
    p_token_hash        bytea,
    p_roles             text[],
    p_catalogue_version bigint,
    p_event_type        text,
    p_payload           jsonb,
    p_endpoint          text        DEFAULT NULL,
    p_idempotency_key   text        DEFAULT NULL,
    p_ordering_key      text        DEFAULT NULL,
    p_priority          integer     DEFAULT 0,
    p_expires_at        timestamptz DEFAULT NULL,
    p_traceparent       text        DEFAULT NULL
) RETURNS TABLE (delivery_id bigint, webhook_id bigint, endpoint_name text, created boolean,
                idempotency_key text)
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM webhooks.api_publish_begin(p_token_hash, p_roles, p_catalogue_version);
    RETURN QUERY SELECT p.delivery_id, p.webhook_id, p.endpoint_name, p.created, p.idempotency_key
                 FROM webhooks.api_publish(p_event_type, p_payload, p_endpoint, p_idempotency_key,
                                           p_ordering_key, p_priority, p_expires_at, p_traceparent) AS p;
END;
$$;

CREATE FUNCTION webhooks.api_publish_batch_as(p_token_hash bytea, p_roles text[], p_catalogue_version bigint,
                                              p_messages jsonb, p_traceparent text DEFAULT NULL)
RETURNS TABLE (ordinal integer, delivery_id bigint, webhook_id bigint, endpoint_name text, created boolean,
               idempotency_key text, refused_sqlstate text, refused_constraint text, refused_message text)
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM webhooks.api_publish_begin(p_token_hash, p_roles, p_catalogue_version);
    RETURN QUERY SELECT b.ordinal, b.delivery_id, b.webhook_id, b.endpoint_name, b.created, b.idempotency_key,
                        b.refused_sqlstate, b.refused_constraint, b.refused_message
                 FROM webhooks.api_publish_batch(p_messages, p_traceparent) AS b;
END;
$$;

-- What a publish under a token does first, in its own statement: take the token's role and tenant
-- (api_authorize()), refusing one that is not usable or whose role is not in p_roles (SQLSTATE
-- 28000); then refuse the publish when the catalogue's version is no longer p_catalogue_version,
-- the one its payloads were checked at (SQLSTATE WHC01: the API reads the catalogue again).
CREATE FUNCTION webhooks.api_publish_begin(p_token_hash bytea, p_roles text[], p_catalogue_version bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM webhooks.api_authorize(p_token_hash, p_roles) a
                   WHERE a.role = ANY (p_roles)) THEN
        RAISE EXCEPTION 'the token is not valid (unknown, revoked or expired) or may not do this'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM webhooks.event_types_version v WHERE v.version = p_catalogue_version) THEN
        RAISE EXCEPTION 'the event-type catalogue changed since version %', p_catalogue_version
            USING ERRCODE = 'WHC01';
    END IF;
END;
$$;

-- endpoints ---------------------------------------------------------------------------------------

-- Deletes an endpoint. Its finished rows (delivered, dead-lettered) and its audit stay as history,
-- under its id, with its name in webhooks.deleted_endpoints; they are no longer replayed
-- (queue_deliveries(): nothing would send them). Rows still waiting (pending, retrying) refuse the
-- delete (SQLSTATE 55006, with the count), unless p_drop_pending: then each becomes a dead letter
-- with category 'endpoint_deleted' and a reason naming the endpoint and who deleted it, with an
-- audit row, in the same transaction: nothing vanishes. Rows being sent (delivering) always refuse
-- it: their outcome is still to be written; disabled, an endpoint has none within a lease. Its state
-- row is locked first, so no claim takes a row of it meanwhile (claims skip a locked one).
-- Returns how many rows it dropped, or NULL when there is no such endpoint (to the caller).
CREATE FUNCTION webhooks.api_delete_endpoint(p_webhook_id bigint, p_drop_pending boolean DEFAULT false,
                                             p_decided_by text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_endpoint record;
    v_sending bigint;
    v_waiting bigint;
    v_leased_until timestamptz;
    v_reason text;
    v_dropped integer := 0;
BEGIN
    -- the lock holds off a concurrent insert for it (fill_idempotency_key reads it FOR KEY SHARE)
    SELECT e.id, e.name, e.tenant_id INTO v_endpoint FROM webhooks.endpoints e WHERE e.id = p_webhook_id
    FOR UPDATE;
    IF NOT FOUND OR NOT webhooks.caller_sees_endpoint(p_webhook_id) THEN
        RETURN NULL;
    END IF;
    PERFORM FROM webhooks.webhook_health_metrics h WHERE h.webhook_id = p_webhook_id FOR UPDATE;
    SELECT count(*) FILTER (WHERE q.status = 'delivering'),
           count(*) FILTER (WHERE q.status IN ('pending', 'retrying')),
           max(q.locked_until)
    INTO v_sending, v_waiting, v_leased_until
    FROM webhooks.alert_delivery_queue q
    WHERE q.webhook_id = p_webhook_id AND q.status IN ('pending', 'delivering', 'retrying');
    IF v_sending > 0 THEN
        RAISE EXCEPTION 'endpoint % (%) has % deliveries being sent now: disable it, and delete it once '
                        'they end (their leases end by %)', v_endpoint.name, p_webhook_id, v_sending,
                        to_char(v_leased_until AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS "UTC"')
            USING ERRCODE = 'object_in_use';
    END IF;
    IF v_waiting > 0 AND NOT coalesce(p_drop_pending, false) THEN
        RAISE EXCEPTION 'endpoint % (%) still has % deliveries waiting (pending or retrying): delete it '
                        'with drop_pending to make them dead letters (category endpoint_deleted), or '
                        'disable it and delete it once they are delivered or dead-lettered',
                        v_endpoint.name, p_webhook_id, v_waiting
            USING ERRCODE = 'object_in_use';
    END IF;
    IF v_waiting > 0 THEN
        v_reason := format('endpoint deleted with its waiting deliveries by %s: %s (id %s) is gone, and '
                           'a deleted endpoint''s rows are not sent again',
                           coalesce(p_decided_by, session_user), v_endpoint.name, p_webhook_id);
        WITH dropped AS (
            UPDATE webhooks.alert_delivery_queue q
            SET status = 'dead_letter', failure_category = 'endpoint_deleted', dead_letter_reason = v_reason,
                dead_lettered_at = now(), updated_at = now(), digest_id = NULL
            WHERE q.webhook_id = p_webhook_id AND q.status IN ('pending', 'retrying')
            RETURNING q.delivery_id, q.attempts
        ), logged AS (
            INSERT INTO webhooks.alert_delivery_log
                (delivery_id, webhook_id, tenant_id, attempt, outcome, failure_category, error)
            SELECT d.delivery_id, p_webhook_id, v_endpoint.tenant_id, d.attempts, 'dead_letter',
                   'endpoint_deleted', v_reason
            FROM dropped d
            RETURNING 1
        )
        SELECT count(*)::integer INTO v_dropped FROM logged;
    END IF;
    INSERT INTO webhooks.deleted_endpoints (id, name, tenant_id)
    VALUES (v_endpoint.id, v_endpoint.name, v_endpoint.tenant_id);
    DELETE FROM webhooks.endpoints e WHERE e.id = p_webhook_id;
    RETURN v_dropped;
END;
$$;

-- operations ----------------------------------------------------------------------------------------

CREATE FUNCTION webhooks.api_start_replay(p_filter jsonb, p_rate double precision, p_max_rows integer,
                                          p_requested_by text)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    INSERT INTO webhooks.api_operations (kind, filter, rate, max_rows, requested_by, tenant_id)
    VALUES ('replay_dead_letters', coalesce(p_filter, '{}'), p_rate, p_max_rows, p_requested_by,
            webhooks.caller_tenant())
    RETURNING id;
$$;

-- One step of a running operation: a table trigger's backfill (table_trigger_backfill_step()), or a
-- bulk replay: at most p_limit more dead letters (and no more than its
-- max_rows in all). No row when the operation is not running, another session is stepping it, or
-- its next step is not due: a step of n rows at rate r makes the next one due n / r seconds later,
-- in the row, so every API process together keeps the rate.
-- Only rows that were dead letters when the operation started are taken: a replayed row that fails
-- again is a dead letter of a later time, so each row is replayed at most once and the operation
-- ends even while its rows keep failing.
CREATE FUNCTION webhooks.api_replay_step(p_operation_id bigint, p_limit integer)
RETURNS TABLE (status text, processed bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_op webhooks.api_operations;
    v_step integer;
    v_done integer;
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'api_replay_step: p_limit must be 1 to 10000, got %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- a table trigger's backfill is stepped by its own function (functions/triggers.sql)
    IF (SELECT o.kind FROM webhooks.api_operations o WHERE o.id = p_operation_id) = 'trigger_backfill' THEN
        RETURN QUERY SELECT * FROM webhooks.table_trigger_backfill_step(p_operation_id, p_limit);
        RETURN;
    END IF;
    SELECT * INTO v_op FROM webhooks.api_operations o
    WHERE o.id = p_operation_id AND o.kind = 'replay_dead_letters' AND o.status = 'running'
      AND o.next_step_at <= now()
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_step := CASE WHEN v_op.max_rows IS NULL THEN p_limit
                   ELSE least(p_limit, v_op.max_rows - v_op.processed)::integer END;
    v_done := CASE WHEN v_step <= 0 THEN 0 ELSE webhooks.replay_dead_letters(
        (v_op.filter ->> 'webhook_id')::bigint, v_op.filter ->> 'event_type', v_op.filter ->> 'category',
        (v_op.filter ->> 'since')::timestamptz,
        least((v_op.filter ->> 'until')::timestamptz, v_op.created_at), v_step, v_op.tenant_id) END;
    UPDATE webhooks.api_operations o
    SET processed = o.processed + v_done, updated_at = now(),
        next_step_at = CASE WHEN o.rate IS NULL THEN now()
                            ELSE now() + make_interval(secs => greatest(v_step, 1) / o.rate) END,
        status = CASE WHEN v_done < v_step OR v_step <= 0
                        OR o.processed + v_done >= coalesce(o.max_rows, 9223372036854775807)
                      THEN 'done' ELSE 'running' END,
        finished_at = CASE WHEN v_done < v_step OR v_step <= 0
                             OR o.processed + v_done >= coalesce(o.max_rows, 9223372036854775807)
                           THEN now() END
    WHERE o.id = p_operation_id
    RETURNING o.status, o.processed INTO status, processed;
    RETURN NEXT;
END;
$$;

-- A running operation stops: once the step it may be in has committed (the row lock waits for it),
-- it is 'cancelled' and no process steps it again. The status it has after; NULL when there is none.
CREATE FUNCTION webhooks.api_cancel_operation(p_operation_id bigint, p_cancelled_by text) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_status text;
    v_tenant bigint := webhooks.caller_tenant();
BEGIN
    UPDATE webhooks.api_operations o
    SET status = 'cancelled', cancelled_by = p_cancelled_by, updated_at = now(), finished_at = now()
    WHERE o.id = p_operation_id AND o.status = 'running'
      AND (v_tenant IS NULL OR o.tenant_id = v_tenant)
    RETURNING o.status INTO v_status;
    IF v_status IS NULL THEN
        SELECT o.status INTO v_status FROM webhooks.api_operations o
        WHERE o.id = p_operation_id AND (v_tenant IS NULL OR o.tenant_id = v_tenant);
    END IF;
    RETURN v_status;
END;
$$;

-- An operation that cannot go on (its stored filter no longer reads, say) ends as failed, with why.
CREATE FUNCTION webhooks.api_fail_operation(p_operation_id bigint, p_error text) RETURNS void
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    UPDATE webhooks.api_operations
    SET status = 'failed', error = left(p_error, 1000), updated_at = now(), finished_at = now()
    WHERE id = p_operation_id AND status = 'running';
$$;

CREATE FUNCTION webhooks.api_running_operations() RETURNS TABLE (id bigint, rate double precision)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT o.id, o.rate FROM webhooks.api_operations o WHERE o.status = 'running' ORDER BY o.id;
$$;

-- grants --------------------------------------------------------------------------------------------

GRANT EXECUTE ON FUNCTION
    webhooks.api_publish(text, jsonb, text, text, text, integer, timestamptz, text),
    webhooks.api_publish_batch(jsonb, text)
TO webhooks_producer, webhooks_admin, webhooks_tenant_admin;
GRANT EXECUTE ON FUNCTION
    webhooks.api_token_role(bytea),
    webhooks.api_authorize(bytea, text[]),
    webhooks.api_publish_begin(bytea, text[], bigint),
    webhooks.api_publish_check(bytea, text[]),
    webhooks.api_publish_as(bytea, text[], bigint, text, jsonb, text, text, text, integer, timestamptz, text),
    webhooks.api_publish_batch_as(bytea, text[], bigint, jsonb, text)
TO webhooks_authenticator;
-- the catalogue's version, which a publish reads as the token's group role (api_publish_begin())
GRANT SELECT ON webhooks.event_types_version
TO webhooks_producer, webhooks_reader, webhooks_admin, webhooks_tenant_admin;
GRANT EXECUTE ON FUNCTION
    webhooks.api_delete_endpoint(bigint, boolean, text),
    webhooks.api_start_replay(jsonb, double precision, integer, text),
    webhooks.api_replay_step(bigint, integer),
    webhooks.api_fail_operation(bigint, text),
    webhooks.api_cancel_operation(bigint, text),
    webhooks.api_running_operations()
TO webhooks_admin;
GRANT EXECUTE ON FUNCTION
    webhooks.api_delete_endpoint(bigint, boolean, text),
    webhooks.api_start_replay(jsonb, double precision, integer, text),
    webhooks.api_cancel_operation(bigint, text)
TO webhooks_tenant_admin;
GRANT SELECT ON webhooks.api_operations TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;
GRANT EXECUTE ON FUNCTION
    webhooks.api_create_token(text, text, bytea, timestamptz, text),
    webhooks.api_revoke_token(text),
    webhooks.api_token_list()
TO webhooks_admin;
