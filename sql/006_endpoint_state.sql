-- 006_endpoint_state: an endpoint's fleet-wide state and its changes: the circuit breaker, pauses,
-- disabling and enabling, and the table that records who or what decided each change and why.
--
-- The circuit counts availability failures only (5xx, 408, 429, timeouts, connection, DNS, TLS):
-- it opens when at least failure_ratio of the attempts in the last window_seconds failed, with at
-- least min_attempts of them; while open nothing is claimed; after sleep_seconds up to `probes`
-- requests go through (half-open); at least probe_success_ratio of them succeeding closes it,
-- otherwise it reopens with the sleep doubled, up to max_sleep_seconds.

CREATE TABLE webhooks.endpoint_events (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id  bigint      NOT NULL REFERENCES webhooks.endpoints (id) ON DELETE CASCADE,
    -- disabled, enabled, circuit_opened, circuit_half_open, circuit_closed, circuit_reset,
    -- circuit_forced_open, circuit_forced_closed, paused
    change      text        NOT NULL,
    reason      text,
    decided_by  text        NOT NULL,
    delivery_id bigint,
    attempt     integer,
    at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX endpoint_events_by_endpoint ON webhooks.endpoint_events (webhook_id, at);

CREATE FUNCTION webhooks.availability_failure(p_failure_category text, p_http_status integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(p_failure_category IN ('timeout', 'connect', 'dns', 'tls', 'http_5xx', 'rate_limited'),
                    false)
        OR coalesce(p_http_status IN (408, 429) OR p_http_status >= 500, false);
$$;

CREATE FUNCTION webhooks.health_status(consecutive_failures bigint) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN consecutive_failures = 0 THEN 'healthy'
                WHEN consecutive_failures < 5 THEN 'degraded'
                ELSE 'failing' END;
$$;

-- The circuit settings in force for one endpoint: its circuit_policy over delivery_config.
CREATE FUNCTION webhooks.circuit_policy(p_webhook_id bigint)
RETURNS TABLE (failure_ratio real, window_seconds integer, min_attempts integer, sleep_seconds integer,
               max_sleep_seconds integer, probes integer, probe_success_ratio real)
LANGUAGE sql STABLE AS $$
    SELECT coalesce((e.circuit_policy ->> 'failure_ratio')::real, c.circuit_failure_ratio),
           coalesce((e.circuit_policy ->> 'window_seconds')::integer, c.circuit_window_seconds),
           coalesce((e.circuit_policy ->> 'min_attempts')::integer, c.circuit_min_attempts),
           coalesce((e.circuit_policy ->> 'sleep_seconds')::integer, c.circuit_sleep_seconds),
           coalesce((e.circuit_policy ->> 'max_sleep_seconds')::integer, c.circuit_max_sleep_seconds),
           coalesce((e.circuit_policy ->> 'probes')::integer, c.circuit_probes),
           coalesce((e.circuit_policy ->> 'probe_success_ratio')::real, c.circuit_probe_success_ratio)
    FROM webhooks.endpoints e CROSS JOIN webhooks.delivery_config c
    WHERE e.id = p_webhook_id;
$$;

-- Operational events: an endpoint's state changes, published (webhooks.publish) to the endpoints
-- that subscribe to their type explicitly ('*' does not include them), never to the endpoint the
-- event is about, so an event cannot loop back to its cause.
CREATE FUNCTION webhooks.operational_event_type(p_change text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_change
        WHEN 'disabled' THEN 'webhook.endpoint.disabled'
        WHEN 'enabled' THEN 'webhook.endpoint.enabled'
        WHEN 'circuit_opened' THEN 'webhook.circuit.opened'
        WHEN 'circuit_closed' THEN 'webhook.circuit.closed'
        WHEN 'dead_letters' THEN 'webhook.endpoint.dead_letters'
    END;
$$;

CREATE FUNCTION webhooks.publish_operational(p_event_row bigint) RETURNS integer
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
    RETURN webhooks.publish(
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

CREATE FUNCTION webhooks.record_endpoint_event(
    p_webhook_id bigint, p_change text, p_reason text, p_decided_by text,
    p_delivery_id bigint DEFAULT NULL, p_attempt integer DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO webhooks.endpoint_events (webhook_id, change, reason, decided_by, delivery_id, attempt)
    VALUES (p_webhook_id, p_change, p_reason, p_decided_by, p_delivery_id, p_attempt)
    RETURNING id INTO v_id;
    PERFORM webhooks.publish_operational(v_id);
    -- for listeners inside the database (documented channel)
    PERFORM pg_notify('webhooks_endpoint_events', json_build_object(
        'endpoint_id', p_webhook_id, 'change', p_change, 'reason', p_reason)::text);
    RETURN p_change || coalesce(': ' || p_reason, '');
END;
$$;

CREATE FUNCTION webhooks.disable_endpoint(
    p_webhook_id bigint, p_reason text, p_decided_by text DEFAULT 'operator',
    p_delivery_id bigint DEFAULT NULL, p_attempt integer DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    -- Health row first, then the endpoint: the order webhooks.finish() takes them in.
    PERFORM 1 FROM webhooks.webhook_health_metrics WHERE webhook_id = p_webhook_id FOR UPDATE;
    UPDATE webhooks.endpoints
    SET active = false, disabled_reason = p_reason, disabled_at = now(), updated_at = now()
    WHERE id = p_webhook_id AND active;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE webhooks.webhook_health_metrics SET health_status = 'disabled', updated_at = now()
    WHERE webhook_id = p_webhook_id;
    RETURN webhooks.record_endpoint_event(p_webhook_id, 'disabled', p_reason, p_decided_by,
                                          p_delivery_id, p_attempt);
END;
$$;

-- Enabling also resets the circuit, the pause and the failure streak: the operator says the
-- receiver is back. Rows that waited are claimable at once.
CREATE FUNCTION webhooks.enable_endpoint(p_webhook_id bigint, p_decided_by text DEFAULT 'operator')
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM webhooks.webhook_health_metrics WHERE webhook_id = p_webhook_id FOR UPDATE;
    UPDATE webhooks.endpoints
    SET active = true, disabled_reason = NULL, disabled_at = NULL, updated_at = now()
    WHERE id = p_webhook_id AND NOT active;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE webhooks.webhook_health_metrics
    SET health_status = 'unknown', consecutive_failures = 0, failing_since = NULL,
        circuit_state = 'closed', circuit_open_until = NULL, circuit_sleep_seconds = NULL,
        paused_until = NULL, window_attempts = 0, window_failures = 0, previous_attempts = 0,
        previous_failures = 0, updated_at = now()
    WHERE webhook_id = p_webhook_id;
    PERFORM pg_notify('webhooks_queue', '');
    RETURN webhooks.record_endpoint_event(p_webhook_id, 'enabled', NULL, p_decided_by);
END;
$$;

-- Manual circuit control: 'reset' (closed, counters cleared), 'open' (forced open until p_until,
-- or until reset), 'close' (forced closed: never opens by itself until reset).
CREATE FUNCTION webhooks.set_circuit(
    p_webhook_id bigint, p_action text, p_until timestamptz DEFAULT NULL,
    p_decided_by text DEFAULT 'operator'
) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_change text;
    v_found boolean;
BEGIN
    IF p_action = 'reset' THEN
        UPDATE webhooks.webhook_health_metrics
        SET circuit_state = 'closed', circuit_open_until = NULL, circuit_sleep_seconds = NULL,
            window_attempts = 0, window_failures = 0, previous_attempts = 0, previous_failures = 0,
            updated_at = now()
        WHERE webhook_id = p_webhook_id;
        v_found := FOUND;
        v_change := 'circuit_reset';
        PERFORM pg_notify('webhooks_queue', '');
    ELSIF p_action = 'open' THEN
        UPDATE webhooks.webhook_health_metrics
        SET circuit_state = CASE WHEN p_until IS NULL THEN 'forced_open' ELSE 'open' END,
            circuit_opened_at = now(), circuit_open_until = p_until, updated_at = now()
        WHERE webhook_id = p_webhook_id;
        v_found := FOUND;
        v_change := 'circuit_forced_open';
    ELSIF p_action = 'close' THEN
        UPDATE webhooks.webhook_health_metrics
        SET circuit_state = 'forced_closed', circuit_open_until = NULL, updated_at = now()
        WHERE webhook_id = p_webhook_id;
        v_found := FOUND;
        v_change := 'circuit_forced_closed';
        PERFORM pg_notify('webhooks_queue', '');
    ELSE
        RAISE EXCEPTION 'set_circuit: action must be reset, open or close, not %', p_action;
    END IF;
    IF NOT v_found THEN
        RAISE EXCEPTION 'set_circuit: no endpoint %', p_webhook_id;
    END IF;
    RETURN webhooks.record_endpoint_event(
        p_webhook_id, v_change, CASE WHEN p_until IS NOT NULL THEN 'until ' || p_until END,
        p_decided_by);
END;
$$;

-- One batch's outcomes for one endpoint: counters, the circuit's window and transitions, a pause
-- asked for by Retry-After, and disabling (410 Gone, or no success for disable_after). Called by
-- webhooks.finish() once per endpoint per batch, in endpoint-id order. Returns the state change
-- it made, if any, worded for a log line.
CREATE FUNCTION webhooks.record_endpoint_outcomes(
    p_webhook_id            bigint,
    p_decided_by            text,
    p_attempts              integer,
    p_successes             integer,
    p_availability_failures integer,
    p_trailing_failures     integer,
    p_latency_ms            bigint,
    p_last_http_status      integer,
    p_last_failure_category text,
    p_pause_seconds         double precision,
    p_gone_delivery_id      bigint,
    p_last_delivery_id      bigint,
    p_last_attempt          integer,
    p_dead_letters          integer DEFAULT 0
) RETURNS text
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    h         webhooks.webhook_health_metrics;
    policy    record;
    v_failures integer := p_attempts - p_successes;
    v_window  interval;
    v_weight  double precision;
    v_est_attempts double precision;
    v_est_failures double precision;
    v_sleep   integer;
    v_change  text;
    v_dead_letter_notice integer;
    setting   record;
BEGIN
    SELECT * INTO policy FROM webhooks.circuit_policy(p_webhook_id);
    v_window := make_interval(secs => policy.window_seconds);
    SELECT e.active, c.disable_after, c.dead_letter_alert_threshold INTO setting
    FROM webhooks.endpoints e CROSS JOIN webhooks.delivery_config c WHERE e.id = p_webhook_id;

    -- every endpoint has this row from its registration on (trigger create_health_row)
    SELECT * INTO h FROM webhooks.webhook_health_metrics WHERE webhook_id = p_webhook_id FOR UPDATE;

    h.total_attempts := h.total_attempts + p_attempts;
    h.successes := h.successes + p_successes;
    h.failures := h.failures + v_failures;
    h.total_latency_ms := h.total_latency_ms + p_latency_ms;
    h.consecutive_failures := CASE WHEN p_successes > 0 THEN p_trailing_failures
                                   ELSE h.consecutive_failures + v_failures END;
    h.last_http_status := coalesce(p_last_http_status, h.last_http_status);
    h.last_failure_category := coalesce(p_last_failure_category, h.last_failure_category);
    IF p_successes > 0 THEN
        h.last_success_at := now();
    END IF;
    IF v_failures > 0 THEN
        h.last_failure_at := now();
    END IF;
    IF p_trailing_failures = 0 AND p_successes > 0 THEN
        h.failing_since := NULL;
    ELSIF v_failures > 0 AND h.failing_since IS NULL THEN
        h.failing_since := now();
    END IF;

    -- The sliding window: the current fixed window plus the previous one weighted by overlap.
    IF h.window_started_at IS NULL OR now() >= h.window_started_at + 2 * v_window THEN
        h.previous_attempts := 0;
        h.previous_failures := 0;
        h.window_attempts := 0;
        h.window_failures := 0;
        h.window_started_at := now();
    ELSIF now() >= h.window_started_at + v_window THEN
        h.previous_attempts := h.window_attempts;
        h.previous_failures := h.window_failures;
        h.window_attempts := 0;
        h.window_failures := 0;
        h.window_started_at := h.window_started_at + v_window;
    END IF;
    h.window_attempts := h.window_attempts + p_attempts;
    h.window_failures := h.window_failures + p_availability_failures;
    v_weight := greatest(0, 1 - extract(epoch FROM now() - h.window_started_at) / policy.window_seconds);
    v_est_attempts := h.window_attempts + h.previous_attempts * v_weight;
    v_est_failures := h.window_failures + h.previous_failures * v_weight;

    IF h.circuit_state = 'closed' AND v_est_attempts >= policy.min_attempts
            AND v_est_failures >= policy.failure_ratio * v_est_attempts THEN
        v_sleep := policy.sleep_seconds;
        v_change := format('circuit_opened: %s of %s attempts failed in the last %s s',
                           round(v_est_failures::numeric), round(v_est_attempts::numeric),
                           policy.window_seconds);
    ELSIF h.circuit_state = 'half_open' THEN
        h.probe_successes := h.probe_successes + (p_attempts - p_availability_failures);
        h.probe_failures := h.probe_failures + p_availability_failures;
        IF h.probe_successes >= ceil(policy.probe_success_ratio * policy.probes) THEN
            h.circuit_state := 'closed';
            h.circuit_open_until := NULL;
            h.circuit_sleep_seconds := NULL;
            h.window_attempts := 0;
            h.window_failures := 0;
            h.previous_attempts := 0;
            h.previous_failures := 0;
            v_change := format('circuit_closed: %s of %s probes succeeded',
                               h.probe_successes, h.probe_successes + h.probe_failures);
        ELSIF h.probe_failures > policy.probes - ceil(policy.probe_success_ratio * policy.probes) THEN
            -- too many probes failed for the rest to close it: reopen now, sleeping longer
            v_sleep := least(coalesce(h.circuit_sleep_seconds, policy.sleep_seconds) * 2,
                             policy.max_sleep_seconds);
            v_change := format('circuit_opened: %s of %s probes failed',
                               h.probe_failures, h.probe_successes + h.probe_failures);
        END IF;
    END IF;
    IF v_sleep IS NOT NULL THEN
        h.circuit_state := 'open';
        h.circuit_opened_at := now();
        h.circuit_open_until := now() + make_interval(secs => v_sleep);
        h.circuit_sleep_seconds := v_sleep;
        h.probe_successes := 0;
        h.probe_failures := 0;
    END IF;

    IF p_pause_seconds IS NOT NULL AND p_pause_seconds > 0 THEN
        h.paused_until := greatest(h.paused_until, now() + make_interval(secs => p_pause_seconds));
    END IF;
    h.health_status := CASE WHEN setting.active
                            THEN webhooks.health_status(h.consecutive_failures) ELSE 'disabled' END;
    h.dead_letters_since_notice := h.dead_letters_since_notice + coalesce(p_dead_letters, 0);
    IF h.dead_letters_since_notice >= setting.dead_letter_alert_threshold THEN
        v_dead_letter_notice := h.dead_letters_since_notice;
        h.dead_letters_since_notice := 0;
    END IF;

    UPDATE webhooks.webhook_health_metrics SET
        total_attempts = h.total_attempts, successes = h.successes, failures = h.failures,
        consecutive_failures = h.consecutive_failures, total_latency_ms = h.total_latency_ms,
        last_success_at = h.last_success_at, last_failure_at = h.last_failure_at,
        last_http_status = h.last_http_status, last_failure_category = h.last_failure_category,
        health_status = h.health_status, circuit_state = h.circuit_state,
        circuit_opened_at = h.circuit_opened_at, circuit_open_until = h.circuit_open_until,
        circuit_sleep_seconds = h.circuit_sleep_seconds, probe_successes = h.probe_successes, probe_failures = h.probe_failures,
        window_started_at = h.window_started_at, window_attempts = h.window_attempts,
        window_failures = h.window_failures, previous_attempts = h.previous_attempts,
        previous_failures = h.previous_failures, paused_until = h.paused_until,
        failing_since = h.failing_since, dead_letters_since_notice = h.dead_letters_since_notice,
        updated_at = now()
    WHERE webhook_id = p_webhook_id;

    IF v_change IS NOT NULL THEN
        v_change := webhooks.record_endpoint_event(
            p_webhook_id, split_part(v_change, ': ', 1), split_part(v_change, ': ', 2),
            'circuit breaker', p_last_delivery_id, p_last_attempt);
    END IF;

    IF v_dead_letter_notice IS NOT NULL THEN
        v_change := concat_ws('; ', v_change, webhooks.record_endpoint_event(
            p_webhook_id, 'dead_letters', v_dead_letter_notice || ' new dead letters',
            p_decided_by, p_last_delivery_id, p_last_attempt));
    END IF;
    IF p_gone_delivery_id IS NOT NULL THEN
        v_change := concat_ws('; ', v_change, webhooks.disable_endpoint(
            p_webhook_id, 'HTTP 410 Gone on delivery ' || p_gone_delivery_id, p_decided_by,
            p_gone_delivery_id, NULL));
    ELSIF h.failing_since IS NOT NULL AND h.failing_since < now() - setting.disable_after THEN
        v_change := concat_ws('; ', v_change, webhooks.disable_endpoint(
            p_webhook_id, 'no successful delivery since ' || h.failing_since, p_decided_by,
            p_last_delivery_id, p_last_attempt));
    END IF;
    RETURN v_change;
END;
$$;

-- How long a row keeps being retried: the schedule's delays for max_attempts - 1 retries.
CREATE FUNCTION webhooks.retry_window(p_schedule jsonb, p_max_attempts integer) RETURNS interval
LANGUAGE sql IMMUTABLE AS $$
    SELECT make_interval(secs => coalesce(sum(
        CASE WHEN p_schedule ? 'delays'
             THEN (p_schedule -> 'delays' ->> least(n, jsonb_array_length(p_schedule -> 'delays') - 1))::double precision
             ELSE least((p_schedule ->> 'cap')::double precision,
                        (p_schedule ->> 'base')::double precision
                        * power(coalesce((p_schedule ->> 'multiplier')::double precision, 2), n))
        END), 0))
    FROM generate_series(0, p_max_attempts - 2) AS n;
$$;

-- Disabled endpoints' rows wait; once a row's retry window has passed it becomes a dead letter
-- (reason 'endpoint disabled') that can be replayed. Bounded per call; returns how many.
CREATE FUNCTION webhooks.expire_disabled_endpoint_rows(p_limit integer DEFAULT 1000) RETURNS integer
LANGUAGE sql
SET jit = off
AS $$
    WITH expired AS (
        SELECT q.delivery_id
        FROM webhooks.endpoints e
        CROSS JOIN webhooks.delivery_config c
        JOIN webhooks.alert_delivery_queue q
          ON q.webhook_id = e.id AND q.status IN ('pending', 'retrying')
        WHERE NOT e.active
          AND q.scheduled_at + webhooks.retry_window(
                coalesce(e.retry_schedule, c.retry_schedule),
                coalesce(q.max_attempts, e.max_attempts, c.max_attempts)) < now()
        LIMIT p_limit
        FOR UPDATE OF q SKIP LOCKED
    ), dead AS (
        UPDATE webhooks.alert_delivery_queue q
        SET status = 'dead_letter', dead_letter_reason = 'endpoint disabled',
            dead_lettered_at = now(), updated_at = now()
        FROM expired x WHERE q.delivery_id = x.delivery_id
        RETURNING q.delivery_id, q.webhook_id, q.attempts
    ), logged AS (
        INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome, error)
        SELECT delivery_id, webhook_id, attempts, 'dead_letter', 'endpoint disabled' FROM dead
        RETURNING 1
    )
    SELECT count(*)::integer FROM logged;
$$;
