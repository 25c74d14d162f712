-- 011_tenant_names: a tenant's name cannot be all digits, because `/v1/tenants/{id}` reads all digits
-- as an id (as endpoints do since 008): a tenant named '2' took over tenant 2 there. Existing such
-- names become 'tenant-<name>' (with a number appended if that is taken), and `webhook-worker
-- migrate` prints a note for each rename.

DO $$
DECLARE
    v_tenant record;
    v_name text;
    v_suffix integer;
BEGIN
    FOR v_tenant IN SELECT id, name FROM webhooks.tenants WHERE name ~ '^[0-9]+$' ORDER BY id LOOP
        v_name := 'tenant-' || v_tenant.name;
        v_suffix := 1;
        WHILE EXISTS (SELECT 1 FROM webhooks.tenants WHERE name = v_name) LOOP
            v_suffix := v_suffix + 1;
            v_name := 'tenant-' || v_tenant.name || '-' || v_suffix;
        END LOOP;
        UPDATE webhooks.tenants SET name = v_name WHERE id = v_tenant.id;
        RAISE NOTICE 'tenant % was named ''%'', which reads as an id: renamed ''%''',
            v_tenant.id, v_tenant.name, v_name;
    END LOOP;
END;
$$;

ALTER TABLE webhooks.tenants
    ADD CONSTRAINT tenants_name_not_numeric CHECK (name !~ '^[0-9]+$');
