-- 022_roles: least privilege. Three group roles (NOLOGIN); give each login role the one it needs:
--
--   CREATE ROLE worker_pod LOGIN PASSWORD '…' IN ROLE webhooks_worker;   -- webhook-worker processes
--   CREATE ROLE billing_app LOGIN PASSWORD '…' IN ROLE webhooks_producer; -- applications that enqueue
--   CREATE ROLE oncall LOGIN PASSWORD '…' IN ROLE webhooks_reader;        -- dashboards, audits
--
-- webhooks_worker may EXECUTE the functions a worker calls and nothing else: no table privileges
--   at all. Those functions are SECURITY DEFINER (they run as the schema owner) with a fixed
--   search_path, so a caller cannot substitute objects of its own.
-- webhooks_producer may INSERT the producer's columns of the queue (not status, attempts or leases)
--   and call enqueue() and publish(). It reads nothing: not endpoints, not other producers' rows.
-- webhooks_reader may SELECT the queue, the audit log, health, events and the settings, and the
--   endpoints without their credential columns (url, signing_secrets, secret_settings).
-- Administration (endpoints, replay, purge, `webhook-worker migrate` and the operator CLI) stays
-- with the schema owner.
--
-- Roles belong to the cluster, not the database: several installations in one cluster share these
-- group roles, so keep their login roles apart with CONNECT privileges on each database.
-- Creating the roles needs CREATEROLE; without it, create them beforehand (the names above) and the
-- migration only grants.

DO $$
DECLARE
    v_role text;
BEGIN
    FOREACH v_role IN ARRAY ARRAY['webhooks_worker', 'webhooks_producer', 'webhooks_reader'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = v_role) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', v_role);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- created meanwhile by a migration of another database in this cluster
            END;
        END IF;
    END LOOP;
END;
$$;

-- What the worker reads, as functions (it has no table privileges).
CREATE FUNCTION webhooks.worker_settings()
RETURNS TABLE (max_attempts integer, timeout_ms integer, lease_seconds integer, claim_batch_size integer,
               finish_batch_size integer, notify_enabled boolean)
LANGUAGE sql STABLE AS $$
    SELECT c.max_attempts, c.timeout_ms, c.lease_seconds, c.claim_batch_size, c.finish_batch_size,
           c.notify_enabled
    FROM webhooks.delivery_config c;
$$;

CREATE FUNCTION webhooks.schema_version() RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT max(version) FROM webhooks.schema_migrations;
$$;

-- Nothing is callable by everyone; each role below gets what it needs. Functions of later
-- migrations start the same way.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA webhooks FROM PUBLIC;
ALTER DEFAULT PRIVILEGES IN SCHEMA webhooks REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC;

DO $$
DECLARE
    v_fn regprocedure;
BEGIN
    FOR v_fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'webhooks'::regnamespace
          AND p.proname IN (
              -- the worker's
              'acquire', 'finish', 'release', 'next_due_in', 'queue_stats', 'worker_settings',
              'schema_version', 'credential_keys', 'expire_disabled_endpoint_rows',
              'ensure_log_partitions', 'purge',
              -- the producers'
              'enqueue', 'publish', 'observer_queue_alert', 'notify_workers')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path = pg_catalog, webhooks, pg_temp',
                       v_fn);
    END LOOP;
END;
$$;

GRANT USAGE ON SCHEMA webhooks TO webhooks_worker, webhooks_producer, webhooks_reader;

GRANT EXECUTE ON FUNCTION
    webhooks.acquire(text, integer, integer),
    webhooks.finish(text, jsonb),
    webhooks.release(text, jsonb),
    webhooks.next_due_in(),
    webhooks.queue_stats(integer, interval),
    webhooks.worker_settings(),
    webhooks.schema_version(),
    webhooks.credential_keys(),
    webhooks.expire_disabled_endpoint_rows(integer),
    webhooks.ensure_log_partitions(integer),
    webhooks.purge(integer)
TO webhooks_worker;

GRANT INSERT (webhook_id, event_id, idempotency_key, event_type, payload, source_ref, metadata, priority,
              ordering_key, max_attempts, next_retry_at, traceparent, expires_at)
    ON webhooks.alert_delivery_queue TO webhooks_producer;
GRANT EXECUTE ON FUNCTION
    webhooks.enqueue(bigint, text, jsonb, text, text, integer, text, jsonb, text, integer, timestamptz,
                     text, timestamptz),
    webhooks.publish(text, jsonb, text, text, integer, bigint, boolean),
    webhooks.observer_queue_alert()
TO webhooks_producer;

GRANT SELECT ON webhooks.alert_delivery_queue, webhooks.alert_delivery_log, webhooks.webhook_health_metrics,
                webhooks.endpoint_events, webhooks.delivery_config, webhooks.stats_sample,
                webhooks.schema_migrations, webhooks.delivery_overview, webhooks.endpoint_summary,
                webhooks.queue_statistics, webhooks.held_back
    TO webhooks_reader;
GRANT SELECT (id, name, url_display, active, disabled_reason, disabled_at, event_types, headers, body_format,
              max_attempts, retry_schedule, timeout_ms, rate_limit_per_second, rate_limit_burst,
              max_in_flight, circuit_policy, delivery_ttl, retry_policy, metadata, created_at, updated_at)
    ON webhooks.endpoints TO webhooks_reader;
GRANT EXECUTE ON FUNCTION
    webhooks.delivery(bigint),
    webhooks.delivery_by_key(text, bigint),
    webhooks.delivery_history(bigint),
    webhooks.schema_version()
TO webhooks_reader;
