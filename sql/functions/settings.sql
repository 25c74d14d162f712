-- settings: what a worker reads besides its rows, as functions (it has no table privileges): the
-- fleet-wide delivery settings and the schema version (the highest migration applied), which a
-- worker checks against the range it supports before it claims and in /ready.

CREATE OR REPLACE FUNCTION webhooks.worker_settings()
RETURNS TABLE (max_attempts integer, timeout_ms integer, lease_seconds integer, claim_batch_size integer,
               finish_batch_size integer, notify_enabled boolean)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT c.max_attempts, c.timeout_ms, c.lease_seconds, c.claim_batch_size, c.finish_batch_size,
           c.notify_enabled
    FROM webhooks.delivery_config c;
$$;
GRANT EXECUTE ON FUNCTION webhooks.worker_settings() TO webhooks_worker;

CREATE OR REPLACE FUNCTION webhooks.schema_version() RETURNS integer
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT max(version) FROM webhooks.schema_migrations;
$$;
GRANT EXECUTE ON FUNCTION webhooks.schema_version() TO webhooks_worker;
GRANT EXECUTE ON FUNCTION webhooks.schema_version() TO webhooks_reader, webhooks_admin, webhooks_authenticator;
