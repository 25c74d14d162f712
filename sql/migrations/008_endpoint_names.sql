-- 008_endpoint_names: an endpoint's name cannot be all digits, because an ENDPOINT argument of all
-- digits always means an id (webhooks.endpoint_ref()). A name such as '2' used to capture the
-- endpoint whose id is 2 in the CLI, the API's paths and publishes: calls meant for one endpoint
-- reached another. Existing such names become 'endpoint-<name>' (with a number appended if that is
-- taken), and `webhook-worker migrate` prints a note for each rename. Each old name is kept in
-- endpoint_renamed_names: a caller still using it (a producer's `"endpoint": "2"`) is refused as
-- naming no endpoint, rather than sent to the endpoint whose id it spells, until the operator
-- deletes that row.

CREATE TABLE webhooks.endpoint_renamed_names (
    name       text        PRIMARY KEY,
    webhook_id bigint      NOT NULL,
    new_name   text        NOT NULL,
    renamed_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE webhooks.endpoint_renamed_names IS
    'All-digit endpoint names renamed by 008: endpoint_ref() answers no endpoint for them, not the id '
    'they spell, until the row is deleted.';

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
        INSERT INTO webhooks.endpoint_renamed_names (name, webhook_id, new_name)
        VALUES (v_endpoint.name, v_endpoint.id, v_name);
        RAISE NOTICE 'endpoint % was named ''%'', which reads as an id: renamed ''%''; until its row in '
                     'webhooks.endpoint_renamed_names is deleted, ''%'' names no endpoint (not id %)',
            v_endpoint.id, v_endpoint.name, v_name, v_endpoint.name, v_endpoint.name;
    END LOOP;
END;
$$;

ALTER TABLE webhooks.endpoints
    ADD CONSTRAINT endpoints_name_not_numeric CHECK (name !~ '^[0-9]+$');
