-- roles: what each group role may do with the tables and views (the roles themselves are made by
-- migrations/001_baseline.sql, 007_api_login.sql and 015_self_service.sql; each function's EXECUTE
-- grant is beside the function).
--
-- webhooks_worker may EXECUTE the functions a worker calls and nothing else: no table privileges
--   at all. Those functions are SECURITY DEFINER (they run as the schema owner) with a fixed
--   search_path, so a caller cannot substitute objects of its own.
-- webhooks_producer may INSERT the producer's columns of the queue (not status, attempts or leases)
--   and call enqueue() and publish(). It reads no payload and no endpoint: only the queue's
--   (delivery_id, webhook_id, idempotency_key), which INSERT … ON CONFLICT (webhook_id,
--   idempotency_key) DO NOTHING RETURNING delivery_id needs. Event types starting with 'webhook.'
--   are reserved for the worker's operational events: publish() and an insert trigger refuse them.
-- webhooks_reader may SELECT the queue, the messages, the audit log, health, events, the settings
--   and the liveness table, and the endpoints without their credential columns (url, signing_secrets,
--   secret_settings, headers).
-- webhooks_admin (an admin token's requests over the HTTP API) reads what webhooks_reader reads,
--   granted beside each of the reader's grants (and under the same row-level security), and changes
--   things only through the administration functions granted to it (SECURITY DEFINER, fixed
--   search_path: registering and changing endpoints, their circuits and credentials, replay,
--   tenants, bulk operations, table triggers: functions/triggers.sql, whose table_trigger_add()
--   runs as its caller and needs the table's owner or its TRIGGER privilege besides) and the
--   settable columns of delivery_config (`config set`: each column's type and CHECK constraints are
--   the rule). No table may it write directly otherwise.
-- webhooks_tenant_admin (a tenant_admin token's requests, always with webhooks.tenant set) reads
--   what a reader kept to its tenant reads of the tenant's own rows (not the fleet's liveness or
--   stats sample, which name other tenants), the event-type catalogue, the table triggers whose
--   fixed tenant is its own (table_trigger_summary), and changes things through
--   the administration functions of endpoints, replay and bulk operations, each of which keeps to
--   the caller's tenant (caller_tenant(), functions/access.sql). Without the setting it sees no
--   row (the restrictive policies of migrations/015_self_service.sql) and those functions refuse.
--   Never the settings, tenants, tokens or event types to change.
-- webhooks_authenticator is what the API's login holds between requests: checking tokens and
--   console sessions, and the schema version (/ready). Nothing else.
-- The rest of administration (tokens, purge, keys, `webhook-worker migrate` and the operator CLI)
-- stays with the schema owner, which should not be a superuser.
--
-- `webhook-worker migrate` revokes every privilege these roles and PUBLIC hold in the schema before
-- it applies sql/functions/, and PUBLIC's EXECUTE on every function after, so what these files grant
-- is exactly what the roles have: a grant removed here is removed from the database.

GRANT USAGE ON SCHEMA webhooks
    TO webhooks_worker, webhooks_producer, webhooks_reader, webhooks_admin, webhooks_tenant_admin,
       webhooks_authenticator;

GRANT INSERT (webhook_id, event_id, idempotency_key, event_type, payload, source_ref, metadata, priority,
              ordering_key, max_attempts, next_retry_at, traceparent, expires_at)
    ON webhooks.alert_delivery_queue TO webhooks_producer;
GRANT SELECT (delivery_id, webhook_id, idempotency_key) ON webhooks.alert_delivery_queue TO webhooks_producer;

GRANT SELECT ON webhooks.alert_delivery_queue, webhooks.alert_delivery_log, webhooks.webhook_health_metrics,
                webhooks.endpoint_events, webhooks.delivery_config, webhooks.stats_sample,
                webhooks.schema_migrations, webhooks.worker_liveness, webhooks.tenants,
                webhooks.endpoint_renamed_names, webhooks.messages
    TO webhooks_reader, webhooks_admin;
GRANT SELECT (id, name, url_display, active, disabled_reason, disabled_at, event_types, body_format,
              max_attempts, retry_schedule, timeout_ms, rate_limit_per_second, rate_limit_burst,
              max_in_flight, circuit_policy, delivery_ttl, retry_policy, metadata, created_at, updated_at,
              coalesce_max, coalesce_window, tenant_id)
    ON webhooks.endpoints TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;
-- Under row-level security; delivery_config for the defaults an endpoint's settings override,
-- endpoint_renamed_names for endpoint_ref(), which runs as its caller.
GRANT SELECT ON webhooks.alert_delivery_queue, webhooks.alert_delivery_log, webhooks.webhook_health_metrics,
                webhooks.endpoint_events, webhooks.delivery_config, webhooks.schema_migrations, webhooks.tenants,
                webhooks.endpoint_renamed_names
    TO webhooks_tenant_admin;

-- `config set` over the API (PATCH /v1/config) and the CLI: the settings, not the singleton key.
GRANT UPDATE (max_attempts, retry_schedule, retry_jitter, max_deferrals, timeout_ms, lease_seconds,
              claim_batch_size, finish_batch_size, notify_enabled, delivered_retention, log_retention,
              rate_limit_per_second, rate_limit_burst, max_in_flight, circuit_failure_ratio,
              circuit_window_seconds, circuit_min_attempts, circuit_sleep_seconds,
              circuit_max_sleep_seconds, circuit_probes, circuit_probe_success_ratio, disable_after,
              updated_at)
    ON webhooks.delivery_config TO webhooks_admin;
-- A CHECK constraint on retry_schedule calls it, as whoever writes the row.
GRANT EXECUTE ON FUNCTION webhooks.valid_retry_schedule(jsonb) TO webhooks_admin;
