-- 018_endpoint_changes: changing a registered endpoint, and rotating its signing secrets.
--
-- Rotation keeps the old secrets active until the time the operator sets, so receivers can switch
-- keys without downtime: every request carries one signature per active secret.

-- Applies the keys present in p_changes (url, url_display, event_types, headers, max_attempts,
-- timeout_ms, retry_schedule, rate_limit_per_second, rate_limit_burst, max_in_flight,
-- circuit_policy, body_format, secret_settings, delivery_ttl, retry_policy); a key with a JSON null
-- resets that override.
CREATE FUNCTION webhooks.update_endpoint(p_webhook_id bigint, p_changes jsonb) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_unknown text;
BEGIN
    SELECT k INTO v_unknown FROM jsonb_object_keys(p_changes) k
    WHERE k NOT IN ('url', 'url_display', 'event_types', 'headers', 'max_attempts', 'timeout_ms',
                    'retry_schedule', 'rate_limit_per_second', 'rate_limit_burst', 'max_in_flight',
                    'circuit_policy', 'body_format', 'secret_settings', 'delivery_ttl', 'retry_policy')
    LIMIT 1;
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION 'update_endpoint: unknown field %', v_unknown;
    END IF;
    UPDATE webhooks.endpoints e SET
        url = CASE WHEN p_changes ? 'url' THEN p_changes ->> 'url' ELSE e.url END,
        url_display = CASE WHEN p_changes ? 'url_display' THEN p_changes ->> 'url_display' ELSE e.url_display END,
        event_types = CASE WHEN p_changes ? 'event_types'
                           THEN ARRAY(SELECT jsonb_array_elements_text(p_changes -> 'event_types'))
                           ELSE e.event_types END,
        headers = CASE WHEN p_changes ? 'headers' THEN p_changes -> 'headers' ELSE e.headers END,
        max_attempts = CASE WHEN p_changes ? 'max_attempts' THEN (p_changes ->> 'max_attempts')::integer
                            ELSE e.max_attempts END,
        timeout_ms = CASE WHEN p_changes ? 'timeout_ms' THEN (p_changes ->> 'timeout_ms')::integer
                          ELSE e.timeout_ms END,
        retry_schedule = CASE WHEN p_changes ? 'retry_schedule' THEN nullif(p_changes -> 'retry_schedule', 'null')
                              ELSE e.retry_schedule END,
        rate_limit_per_second = CASE WHEN p_changes ? 'rate_limit_per_second'
                                     THEN (p_changes ->> 'rate_limit_per_second')::numeric
                                     ELSE e.rate_limit_per_second END,
        rate_limit_burst = CASE WHEN p_changes ? 'rate_limit_burst'
                                THEN (p_changes ->> 'rate_limit_burst')::integer ELSE e.rate_limit_burst END,
        max_in_flight = CASE WHEN p_changes ? 'max_in_flight' THEN (p_changes ->> 'max_in_flight')::integer
                             ELSE e.max_in_flight END,
        circuit_policy = CASE WHEN p_changes ? 'circuit_policy' THEN p_changes -> 'circuit_policy'
                              ELSE e.circuit_policy END,
        body_format = CASE WHEN p_changes ? 'body_format' THEN p_changes ->> 'body_format' ELSE e.body_format END,
        secret_settings = CASE WHEN p_changes ? 'secret_settings' THEN p_changes -> 'secret_settings'
                               ELSE e.secret_settings END,
        delivery_ttl = CASE WHEN p_changes ? 'delivery_ttl' THEN (p_changes ->> 'delivery_ttl')::interval
                            ELSE e.delivery_ttl END,
        retry_policy = CASE WHEN p_changes ? 'retry_policy' THEN p_changes -> 'retry_policy'
                            ELSE e.retry_policy END,
        updated_at = now()
    WHERE e.id = p_webhook_id;
    RETURN FOUND;
END;
$$;

-- Adds p_new_secret as the newest secret; every secret active now expires at p_old_expire_at
-- (NULL: they stay active until rotated again). Expired secrets are dropped.
CREATE FUNCTION webhooks.rotate_secret(p_webhook_id bigint, p_new_secret text,
                                       p_old_expire_at timestamptz DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    UPDATE webhooks.endpoints e SET
        signing_secrets = jsonb_build_array(jsonb_build_object('secret', p_new_secret, 'expires_at', NULL))
            || coalesce((
                SELECT jsonb_agg(CASE WHEN s ->> 'expires_at' IS NULL
                                      THEN jsonb_set(s, '{expires_at}', coalesce(to_jsonb(p_old_expire_at), 'null'))
                                      ELSE s END)
                FROM jsonb_array_elements(e.signing_secrets) s
                WHERE s ->> 'expires_at' IS NULL OR (s ->> 'expires_at')::timestamptz > now()), '[]'),
        updated_at = now()
    WHERE e.id = p_webhook_id
    RETURNING jsonb_array_length(e.signing_secrets) INTO v_count;
    RETURN v_count;
END;
$$;
