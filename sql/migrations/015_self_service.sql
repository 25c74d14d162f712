-- 015_self_service: tenant administrators, the event-type catalogue, tenant-scoped bulk operations.
--
-- A group role (NOLOGIN; its privileges: functions/roles.sql and beside each function):
--   webhooks_tenant_admin  what a tenant administrator's requests may do (an API token of role
--                          tenant_admin, always scoped to one tenant): what webhooks_admin may do to
--                          endpoints, deliveries, dead letters and bulk replays, kept to the tenant
--                          set in webhooks.tenant by row-level security and by the functions it is
--                          granted; never the settings, tenants or tokens.
-- The API's login is a member, as of the other group roles, and switches to it per request:
--
--   GRANT webhooks_tenant_admin TO api_pod;
--
-- Creating the role needs CREATEROLE, as 007_api_login's do; without it, create it beforehand
-- (CREATE ROLE webhooks_tenant_admin NOLOGIN) and the migration only grants.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'webhooks_tenant_admin') THEN
        BEGIN
            CREATE ROLE webhooks_tenant_admin NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- created meanwhile by a migration of another database in this cluster
        END;
    END IF;
END;
$$;

-- An API that still logs in as the owner keeps working (as 007_api_login does for the others).
DO $$
BEGIN
    IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
        GRANT webhooks_tenant_admin TO CURRENT_USER;
    END IF;
EXCEPTION WHEN insufficient_privilege OR invalid_grant_operation THEN
    RAISE NOTICE 'an API logging in as this role needs membership of webhooks_tenant_admin; give the API '
                 'a login of its own instead (docs/security.md)';
END;
$$;

-- Tokens: a tenant_admin token always has a tenant (it is never every tenant's administrator).
ALTER TABLE webhooks.api_tokens
    DROP CONSTRAINT api_tokens_role_check,
    ADD CONSTRAINT api_tokens_role_check CHECK (role IN ('producer', 'reader', 'admin', 'tenant_admin')),
    DROP CONSTRAINT api_token_tenant_role,
    ADD CONSTRAINT api_token_tenant_role
        CHECK (tenant_id IS NULL OR role IN ('producer', 'reader', 'tenant_admin')),
    ADD CONSTRAINT api_token_tenant_admin_scoped CHECK (role <> 'tenant_admin' OR tenant_id IS NOT NULL);

-- A bulk replay a tenant administrator starts keeps to its tenant while the API's runner (which
-- steps it unscoped, as webhooks_admin) advances it; NULL: every tenant, as before.
ALTER TABLE webhooks.api_operations ADD COLUMN tenant_id bigint REFERENCES webhooks.tenants (id);
ALTER POLICY tenant_isolation ON webhooks.api_operations
    USING (nullif(current_setting('webhooks.tenant', true), '') IS NULL
           OR tenant_id = nullif(current_setting('webhooks.tenant', true), '')::bigint);

-- A tenant administrator's session without a tenant sees no row at all (these policies are ANDed
-- with tenant_isolation), rather than every tenant's: were the API ever to forget the setting, the
-- database would still keep it out. The functions it is granted refuse the same way
-- (webhooks.caller_tenant()).
DO $$
DECLARE
    v_table text;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['endpoints', 'alert_delivery_queue', 'alert_delivery_log', 'tenants',
                                   'webhook_health_metrics', 'endpoint_events', 'api_operations'] LOOP
        EXECUTE format('CREATE POLICY tenant_admin_needs_tenant ON webhooks.%I AS RESTRICTIVE'
                       ' TO webhooks_tenant_admin'
                       ' USING (nullif(current_setting(''webhooks.tenant'', true), '''') IS NOT NULL)',
                       v_table);
    END LOOP;
END;
$$;

-- The event-type catalogue: the types producers publish, each with what it means and, optionally,
-- the JSON Schema its payloads follow (the API validates a publish against it; a producer inserting
-- through SQL is not validated). One catalogue for the deployment, not one per tenant: the event
-- types are the sending application's (what it publishes), the same for every tenant it serves, as
-- a fan-out sends one event to the subscribers of every tenant. Names follow the queue's rule for
-- event types (event_type_printable), and hold no '*', which subscriptions use as a wildcard.
CREATE TABLE webhooks.event_types (
    name        text        PRIMARY KEY
        CONSTRAINT event_type_name_form
        CHECK (octet_length(name) BETWEEN 1 AND 256 AND name !~ '[[:cntrl:]]' AND strpos(name, '*') = 0),
    description text        NOT NULL DEFAULT ''
        CONSTRAINT event_type_description_length CHECK (length(description) <= 2000),
    -- a JSON Schema is an object or a boolean (draft 2020-12); its validity as a schema is checked
    -- by the CLI and the API (worker/event_types.py), which PostgreSQL cannot do
    schema      jsonb
        CONSTRAINT event_type_schema_form CHECK (schema IS NULL OR jsonb_typeof(schema) IN ('object', 'boolean')),
    deprecated  boolean     NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE webhooks.event_types IS
    'Event-type catalogue: name, description, optional JSON Schema of the payload, deprecated.';

-- The worker's own types ('webhook.*', reserved: no producer publishes them) are in the catalogue
-- from the start, so that endpoints subscribing to them are not shown as subscribing to nothing.
INSERT INTO webhooks.event_types (name, description) VALUES
    ('webhook.test', 'A test event sent to one endpoint on request (send_test_event)'),
    ('webhook.endpoint.disabled', 'An endpoint of the tenant was disabled, by an operator or the worker'),
    ('webhook.endpoint.enabled', 'An endpoint of the tenant was enabled'),
    ('webhook.endpoint.dead_letters', 'An endpoint of the tenant reached its dead-letter alert threshold'),
    ('webhook.circuit.opened', 'An endpoint''s circuit breaker opened'),
    ('webhook.circuit.closed', 'An endpoint''s circuit breaker closed again');
