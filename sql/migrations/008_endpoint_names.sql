-- 008_endpoint_names: an endpoint's name cannot be all digits, because an ENDPOINT argument of all
-- digits always means an id (webhooks.endpoint_ref()). A name such as '2' used to capture the
-- endpoint whose id is 2 in the CLI, the API's paths and publishes: calls meant for one endpoint
-- reached another. Existing such names become 'endpoint-<name>' (with a number appended if that is
-- taken), and `webhook-worker migrate` prints a note for each rename.

DO $$
DECLARE
    v_endpoint record;
    v_name text;
    v_suffix integer;
BEGIN
    FOR v_endpoint IN SELECT id, name FROM webhooks.endpoints WHERE name ~ '^[0-9]+$' ORDER BY id LOOP
        v_name := 'endpoint-' || v_endpoint.name;
        v_suffix := 1;
        WHILE EXISTS (SELECT 1 FROM webhooks.endpoints WHERE name = v_name) LOOP
            v_suffix := v_suffix + 1;
            v_name := 'endpoint-' || v_endpoint.name || '-' || v_suffix;
        END LOOP;
        UPDATE webhooks.endpoints SET name = v_name, updated_at = now() WHERE id = v_endpoint.id;
        RAISE NOTICE 'endpoint % was named ''%'', which reads as an id: renamed ''%''',
            v_endpoint.id, v_endpoint.name, v_name;
    END LOOP;
END;
$$;

ALTER TABLE webhooks.endpoints
    ADD CONSTRAINT endpoints_name_not_numeric CHECK (name !~ '^[0-9]+$');
