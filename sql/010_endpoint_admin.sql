-- 010_endpoint_admin: registering endpoints and listing them without their credentials.
--
-- The worker side computes url_display and owns the secrets (a later migration stores them as
-- ciphertext); this function only validates and stores. endpoint_summary is what may be shown.

CREATE FUNCTION webhooks.register_endpoint(
    p_name            text,
    p_url             text,
    p_url_display     text,
    p_signing_secrets jsonb,
    p_event_types     text[] DEFAULT '{*}',
    p_headers         jsonb  DEFAULT '{}',
    p_max_attempts    integer DEFAULT NULL,
    p_timeout_ms      integer DEFAULT NULL,
    p_retry_schedule  jsonb  DEFAULT NULL,
    p_rate_limit_per_second numeric DEFAULT NULL,
    p_rate_limit_burst integer DEFAULT NULL,
    p_max_in_flight   integer DEFAULT NULL,
    p_circuit_policy  jsonb  DEFAULT '{}',
    p_body_format     text   DEFAULT 'raw',
    p_secret_settings jsonb  DEFAULT '{}',
    p_active          boolean DEFAULT true
) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO webhooks.endpoints
        (name, url, url_display, signing_secrets, event_types, headers, max_attempts, timeout_ms,
         retry_schedule, rate_limit_per_second, rate_limit_burst, max_in_flight, circuit_policy,
         body_format, secret_settings, active, disabled_reason, disabled_at)
    VALUES
        (p_name, p_url, p_url_display, p_signing_secrets, coalesce(p_event_types, '{*}'),
         coalesce(p_headers, '{}'), p_max_attempts, p_timeout_ms, p_retry_schedule,
         p_rate_limit_per_second, p_rate_limit_burst, p_max_in_flight, coalesce(p_circuit_policy, '{}'),
         coalesce(p_body_format, 'raw'), coalesce(p_secret_settings, '{}'), coalesce(p_active, true),
         CASE WHEN NOT coalesce(p_active, true) THEN 'awaiting verification' END,
         CASE WHEN NOT coalesce(p_active, true) THEN now() END)
    RETURNING id;
$$;

CREATE VIEW webhooks.endpoint_summary AS
SELECT e.id, e.name, e.url_display, e.active, e.disabled_reason, e.event_types,
       jsonb_array_length(e.signing_secrets) AS secrets, e.body_format, e.max_attempts, e.timeout_ms,
       e.created_at, h.health_status, h.total_attempts, h.successes, h.failures,
       h.consecutive_failures, h.last_success_at, h.last_failure_at, h.circuit_state,
       h.circuit_open_until, h.paused_until, e.rate_limit_per_second, e.rate_limit_burst,
       e.max_in_flight
FROM webhooks.endpoints e
LEFT JOIN webhooks.webhook_health_metrics h ON h.webhook_id = e.id;
