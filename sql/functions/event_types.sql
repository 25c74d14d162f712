-- event_types: the catalogue of the event types producers publish (the table:
-- migrations/015_self_service.sql), and the worker's own test event.
--
--   SELECT * FROM webhooks.event_type_list();
--   SELECT webhooks.upsert_event_type('invoice.paid', 'An invoice was paid',
--                                     '{"type": "object", "required": ["invoice_id"]}');
--   SELECT webhooks.deprecate_event_type('invoice.paid');
--   SELECT * FROM webhooks.unmatched_subscriptions();   -- patterns no catalogued type matches
--   SELECT * FROM webhooks.event_type_subscriptions('invoice.paid');  -- the patterns that match it
--   SELECT webhooks.send_test_event('billing');         -- a webhook.test to that endpoint alone
--
-- The catalogue is one for the deployment: every reader, admin, tenant administrator and producer
-- reads it (the API validates a publish against its type's schema, worker/rules/event_types.py, read with
-- the publish's token: api_publish_check(), functions/api.sql); only webhooks_admin changes it,
-- through upsert_event_type() and deprecate_event_type() (SECURITY DEFINER, fixed search_path). The worker's own 'webhook.*' types
-- are catalogued by the migration and cannot be changed here, as no producer may publish them.

-- The catalogue, by name; without deprecated types unless asked.
CREATE OR REPLACE FUNCTION webhooks.event_type_list(p_include_deprecated boolean DEFAULT true)
RETURNS TABLE (name text, description text, schema jsonb, deprecated boolean, created_at timestamptz,
               updated_at timestamptz)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT t.name, t.description, t.schema, t.deprecated, t.created_at, t.updated_at
    FROM webhooks.event_types t
    WHERE coalesce(p_include_deprecated, true) OR NOT t.deprecated
    ORDER BY t.name;
$$;

-- One type's row (none when it is not catalogued): what a publish is validated against.
CREATE OR REPLACE FUNCTION webhooks.event_type(p_name text)
RETURNS TABLE (name text, description text, schema jsonb, deprecated boolean)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT t.name, t.description, t.schema, t.deprecated FROM webhooks.event_types t WHERE t.name = p_name;
$$;

CREATE OR REPLACE FUNCTION webhooks.refuse_reserved_catalogue_name(p_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF starts_with(p_name, 'webhook.') THEN
        RAISE EXCEPTION 'event type %: types starting with ''webhook.'' are the worker''s own, catalogued '
                        'by its migrations', p_name
            USING ERRCODE = 'insufficient_privilege';
    END IF;
END;
$$;

-- Adds a type or replaces its description and schema (p_schema NULL: none); p_deprecated NULL keeps
-- what it was (a new type: not deprecated). Returns whether the type is new. The schema's validity
-- as a JSON Schema is the caller's to check (worker/rules/event_types.py: schema_problem()); PostgreSQL
-- holds it to an object or a boolean (event_type_schema_form).
CREATE OR REPLACE FUNCTION webhooks.upsert_event_type(p_name text, p_description text DEFAULT '',
                                                      p_schema jsonb DEFAULT NULL,
                                                      p_deprecated boolean DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_new boolean;
BEGIN
    PERFORM webhooks.refuse_reserved_catalogue_name(p_name);
    INSERT INTO webhooks.event_types AS t (name, description, schema, deprecated)
    VALUES (p_name, coalesce(p_description, ''), p_schema, coalesce(p_deprecated, false))
    ON CONFLICT (name) DO UPDATE
    SET description = EXCLUDED.description, schema = EXCLUDED.schema,
        deprecated = coalesce(p_deprecated, t.deprecated), updated_at = now()
    RETURNING (xmax = 0) INTO v_new;
    RETURN v_new;
END;
$$;

-- Marks a type deprecated (or, with false, current again). Returns whether the type exists.
CREATE OR REPLACE FUNCTION webhooks.deprecate_event_type(p_name text, p_deprecated boolean DEFAULT true)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    PERFORM webhooks.refuse_reserved_catalogue_name(p_name);
    UPDATE webhooks.event_types t SET deprecated = coalesce(p_deprecated, true), updated_at = now()
    WHERE t.name = p_name;
    RETURN FOUND;
END;
$$;

-- Each endpoint's subscription pattern that matches no catalogued type ('unknown'), or only
-- deprecated ones ('deprecated'): a typo, or a type the application no longer publishes. '*'
-- matches any type. A session kept to a tenant sees its own endpoints' (caller_tenant()).
CREATE OR REPLACE FUNCTION webhooks.unmatched_subscriptions()
RETURNS TABLE (webhook_id bigint, endpoint_name text, pattern text, problem text)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT e.id, e.name, p.pattern,
           CASE WHEN NOT EXISTS (SELECT 1 FROM webhooks.event_types t
                                 WHERE webhooks.subscribes(ARRAY[p.pattern], t.name)) THEN 'unknown'
                ELSE 'deprecated' END
    FROM webhooks.endpoints e
    CROSS JOIN LATERAL unnest(e.event_types) AS p(pattern)
    WHERE NOT EXISTS (SELECT 1 FROM webhooks.event_types t
                      WHERE NOT t.deprecated AND webhooks.subscribes(ARRAY[p.pattern], t.name))
      AND ((SELECT webhooks.caller_tenant()) IS NULL OR e.tenant_id = (SELECT webhooks.caller_tenant()))
    ORDER BY e.id, p.pattern;
$$;

-- Which endpoint subscriptions match each catalogued type (p_event_type: that type's only): the
-- pattern of each endpoint that matches it, by the rule unmatched_subscriptions() uses, except that
-- '*' does not match the worker's own 'webhook.*' types, as the gate (queue_deliveries()) sends
-- those only to endpoints that name them. A session kept to a tenant sees its own endpoints'
-- (caller_tenant()).
CREATE OR REPLACE FUNCTION webhooks.event_type_subscriptions(p_event_type text DEFAULT NULL)
RETURNS TABLE (event_type text, webhook_id bigint, endpoint_name text, pattern text)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT t.name, e.id, e.name, p.pattern
    FROM webhooks.event_types t
    CROSS JOIN webhooks.endpoints e
    CROSS JOIN LATERAL unnest(e.event_types) AS p(pattern)
    WHERE (p_event_type IS NULL OR t.name = p_event_type)
      AND webhooks.subscribes(ARRAY[p.pattern], t.name)
      AND NOT (p.pattern = '*' AND starts_with(t.name, 'webhook.'))
      AND ((SELECT webhooks.caller_tenant()) IS NULL OR e.tenant_id = (SELECT webhooks.caller_tenant()))
    ORDER BY t.name, e.name, p.pattern;
$$;

-- Every change to the catalogue moves its version (migrations/018_api_publish_round_trips.sql), in
-- the changing transaction: an API process keeps the entries it read at a version, and each publish
-- that used them is refused once the version has moved (api_publish_begin(), functions/api.sql).
CREATE OR REPLACE FUNCTION webhooks.event_types_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE webhooks.event_types_version SET version = version + 1;
    RETURN NULL;
END;
$$;
CREATE OR REPLACE TRIGGER event_types_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON webhooks.event_types
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks.event_types_changed();

GRANT SELECT ON webhooks.event_types TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;
GRANT EXECUTE ON FUNCTION webhooks.event_type_list(boolean), webhooks.event_type(text)
    TO webhooks_producer, webhooks_reader, webhooks_admin, webhooks_tenant_admin;
GRANT EXECUTE ON FUNCTION webhooks.unmatched_subscriptions(), webhooks.event_type_subscriptions(text)
    TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;
GRANT EXECUTE ON FUNCTION webhooks.upsert_event_type(text, text, jsonb, boolean),
                          webhooks.deprecate_event_type(text, boolean)
    TO webhooks_admin;

-- test events ---------------------------------------------------------------------------------------

-- A 'webhook.test' event to this endpoint alone (p_endpoint: its id or name, endpoint_ref()),
-- whatever it subscribes to; answered with the delivery id, whose attempts show like any other's.
-- Each call is a new event (a new idempotency key). A session kept to a tenant reaches that tenant's
-- endpoints only; another tenant's, like a missing one, is refused with SQLSTATE P0002. Queued
-- through the gate (queue_deliveries(), functions/enqueue.sql) as a test event: refused for a
-- disabled endpoint (SQLSTATE 55000: a test that waits proves nothing, and its row would hold off
-- the endpoint's deletion), past the endpoint's test events a minute (SQLSTATE WHT29, DETAIL the
-- seconds to wait) and past its tenant's max_queued (SQLSTATE 53400). 'webhook.' types are
-- reserved: producers cannot queue this type by any way in (the queue's insert trigger refuses
-- every role but the owner), while this function, running as the owner, may. Granted to
-- webhooks_admin and webhooks_tenant_admin, never to producers.
CREATE OR REPLACE FUNCTION webhooks.send_test_event(p_endpoint text) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_endpoint record;
    v_event_id text := 'evt_test_' || replace(gen_random_uuid()::text, '-', '');
    v_found bigint;
BEGIN
    SELECT e.id, e.name, t.name AS tenant INTO v_endpoint
    FROM webhooks.endpoints e JOIN webhooks.tenants t ON t.id = e.tenant_id
    WHERE e.id = webhooks.endpoint_ref(p_endpoint) AND webhooks.caller_sees_endpoint(e.id);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'endpoint: no endpoint with this name or id' USING ERRCODE = 'no_data_found';
    END IF;
    -- one request: the gate raises its refusals
    SELECT g.delivery_id INTO v_found
    FROM webhooks.queue_deliveries(ARRAY[ROW(
        1, v_endpoint.id, 'webhook.test', v_event_id, v_event_id,
        jsonb_build_object('type', 'webhook.test', 'endpoint', v_endpoint.name, 'tenant', v_endpoint.tenant,
                           'sent_at', now(),
                           'message', 'A test event from webhook-worker: this endpoint is reachable.'),
        NULL, 'test_event', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::webhooks.delivery_request], 'test') g;
    RETURN v_found;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.send_test_event(text) TO webhooks_admin, webhooks_tenant_admin;
