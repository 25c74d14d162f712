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
--   and call enqueue() and publish(). It reads no payload and no endpoint: only the queue's
--   (delivery_id, webhook_id, idempotency_key), which INSERT … ON CONFLICT (webhook_id,
--   idempotency_key) DO NOTHING RETURNING delivery_id needs. Event types starting with 'webhook.'
--   are reserved for the worker's operational events: publish() refuses them.
-- webhooks_reader may SELECT the queue, the audit log, health, events and the settings, and the
--   endpoints without their credential columns (url, signing_secrets, secret_settings, headers).
-- Administration (endpoints, replay, purge, `webhook-worker migrate` and the operator CLI) stays
-- with the schema owner, which should not be a superuser.
--
-- The fan-out trigger observer_queue_alert() stays SECURITY INVOKER on purpose: it converts the
-- caller's row (to_jsonb(NEW)), which may run the caller's own casts, so it must not run as the
-- owner; it calls publish(), which is SECURITY DEFINER.
-- Note for later migrations: CREATE OR REPLACE of a function below drops SECURITY DEFINER and its
-- SET clause unless they are restated; `webhook-worker migrate` revokes PUBLIC's EXECUTE on every
-- function of the schema after each run, so new functions start closed.
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

-- publish() as producers call it: no exclusions, and the 'webhook.' event types reserved. The
-- operational events (006) fan out through fan_out(), which only the owner's functions call.
ALTER FUNCTION webhooks.publish(text, jsonb, text, text, integer, bigint, boolean) RENAME TO fan_out;

CREATE FUNCTION webhooks.publish(
    p_event_type text,
    p_payload    jsonb,
    p_event_key  text DEFAULT NULL,
    p_source_ref text DEFAULT NULL,
    p_priority   integer DEFAULT 0
) RETURNS integer
LANGUAGE plpgsql
SET jit = off
AS $$
BEGIN
    IF starts_with(p_event_type, 'webhook.') THEN
        RAISE EXCEPTION 'event type % is reserved: types starting with ''webhook.'' are the worker''s own '
                        'operational events', p_event_type
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN webhooks.fan_out(p_event_type, p_payload, p_event_key, p_source_ref, p_priority);
END;
$$;

CREATE OR REPLACE FUNCTION webhooks.publish_operational(p_event_row bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    ev record;
    v_type text;
BEGIN
    SELECT x.*, e.name AS endpoint_name INTO ev
    FROM webhooks.endpoint_events x JOIN webhooks.endpoints e ON e.id = x.webhook_id
    WHERE x.id = p_event_row;
    v_type := webhooks.operational_event_type(ev.change);
    IF v_type IS NULL THEN
        RETURN 0;
    END IF;
    RETURN webhooks.fan_out(
        v_type,
        jsonb_build_object(
            'title', format('Endpoint %s: %s', ev.endpoint_name, replace(ev.change, '_', ' ')),
            'severity', CASE WHEN ev.change IN ('enabled', 'circuit_closed') THEN 'info' ELSE 'warning' END,
            'source', 'webhook-worker',
            'endpoint_id', ev.webhook_id, 'endpoint_name', ev.endpoint_name, 'change', ev.change,
            'reason', ev.reason, 'decided_by', ev.decided_by, 'delivery_id', ev.delivery_id,
            'at', ev.at),
        p_event_key => 'endpoint_events:' || ev.id,
        p_source_ref => 'endpoint_events:' || ev.id,
        p_priority => 10,
        p_exclude_webhook_id => ev.webhook_id,
        p_explicit_only => true);
END;
$$;

-- Nothing is callable by everyone; each role below gets what it needs.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA webhooks FROM PUBLIC;

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
              'enqueue', 'publish',
              -- the statement-level wake-up trigger reads delivery_config (it touches no row data)
              'notify_workers')
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
GRANT SELECT (delivery_id, webhook_id, idempotency_key) ON webhooks.alert_delivery_queue TO webhooks_producer;
GRANT EXECUTE ON FUNCTION
    webhooks.enqueue(bigint, text, jsonb, text, text, integer, text, jsonb, text, integer, timestamptz,
                     text, timestamptz),
    webhooks.publish(text, jsonb, text, text, integer),
    webhooks.observer_queue_alert()
TO webhooks_producer;

GRANT SELECT ON webhooks.alert_delivery_queue, webhooks.alert_delivery_log, webhooks.webhook_health_metrics,
                webhooks.endpoint_events, webhooks.delivery_config, webhooks.stats_sample,
                webhooks.schema_migrations, webhooks.delivery_overview, webhooks.endpoint_summary,
                webhooks.queue_statistics, webhooks.held_back
    TO webhooks_reader;
GRANT SELECT (id, name, url_display, active, disabled_reason, disabled_at, event_types, body_format,
              max_attempts, retry_schedule, timeout_ms, rate_limit_per_second, rate_limit_burst,
              max_in_flight, circuit_policy, delivery_ttl, retry_policy, metadata, created_at, updated_at)
    ON webhooks.endpoints TO webhooks_reader;
GRANT EXECUTE ON FUNCTION
    webhooks.delivery(bigint),
    webhooks.delivery_by_key(text, bigint),
    webhooks.delivery_history(bigint),
    webhooks.schema_version()
TO webhooks_reader;
