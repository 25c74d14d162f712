-- endpoints: registering, changing, disabling and enabling endpoints; their circuit by hand; their
-- sealed credentials; the operational events their state changes publish.
--
-- The worker side computes url_display and seals the credentials (URL, signing secrets, secret
-- settings, header values) with a key PostgreSQL never sees; these functions only validate and
-- store. endpoint_summary is what may be shown. Rotation keeps the old secrets signing until the
-- time the operator sets, so receivers can switch keys without downtime. Every state change is
-- recorded in endpoint_events with who or what decided it and why, and published as an
-- operational event ('webhook.endpoint.*', 'webhook.circuit.*') to the endpoints of the same tenant
-- (and those the operator marked operational_all_tenants) that subscribe to its type explicitly
-- ('*' does not include them), never to the endpoint it is about, so an event cannot loop back to
-- its cause. Disabled endpoints' rows wait; once a row's retry window has passed it becomes a dead
-- letter (reason 'endpoint disabled') that can be replayed.
--
-- What an administrator changes goes through the functions granted to webhooks_admin here (the
-- HTTP API's admin requests run as that role): SECURITY DEFINER with a fixed search_path, since
-- the role writes no table itself and an operational event they publish may be queued only by the
-- owner (functions/enqueue.sql). A tenant administrator (webhooks_tenant_admin) is granted the same
-- functions; each keeps to the caller's tenant (caller_tenant(), functions/access.sql) and answers
-- another tenant's endpoint as it answers a missing one.

-- Every endpoint has its state row from the start, however it was inserted: the claim locks it.
-- The row carries the endpoint's tenant (the claim walks each tenant's endpoints through the
-- index webhook_health_metrics_claim_order), here too when the endpoint moves to another tenant.
CREATE OR REPLACE FUNCTION webhooks.create_health_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO webhooks.webhook_health_metrics (webhook_id, tenant_id) VALUES (NEW.id, NEW.tenant_id)
        ON CONFLICT (webhook_id) DO UPDATE SET tenant_id = excluded.tenant_id;
    ELSE
        -- (only when it changed: an update of the endpoint that names its tenant locks no state row)
        UPDATE webhooks.webhook_health_metrics SET tenant_id = NEW.tenant_id
        WHERE webhook_id = NEW.id AND tenant_id IS DISTINCT FROM NEW.tenant_id;
    END IF;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE TRIGGER create_health_row
    AFTER INSERT OR UPDATE OF tenant_id ON webhooks.endpoints
    FOR EACH ROW EXECUTE FUNCTION webhooks.create_health_row();

-- The endpoint an operator's or a caller's ENDPOINT argument names: all digits is always an id
-- (names cannot be all digits: endpoints_name_not_numeric), anything else a name, or `tenant/name`
-- (the tenant's name, a slash, the endpoint's name). One rule for the CLI, the API, the console and
-- api_publish(), so a name can never capture the id it spells. A name is unique within its tenant
-- only: a session kept to a tenant (caller_tenant()) finds its own tenant's endpoints alone, here
-- and by row-level security (it runs as its caller; the SECURITY DEFINER functions that call it
-- keep to the caller's tenant through this filter), and an unscoped caller naming an endpoint that
-- several tenants hold, or a text that reads both as a name and as `tenant/name`, is refused
-- (too_many_rows, SQLSTATE P0003) and asked for the id or `tenant/name`. A name migration 008
-- renamed names no endpoint until its row in endpoint_renamed_names is deleted.
CREATE OR REPLACE FUNCTION webhooks.endpoint_ref(p_ref text) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_tenant bigint := webhooks.caller_tenant();
    v_found bigint[];
BEGIN
    IF p_ref ~ '^[0-9]+$' THEN
        -- beyond bigint no id exists: not found, rather than an error for a well-formed argument
        IF length(ltrim(p_ref, '0')) > 18 THEN
            RETURN NULL;
        END IF;
        -- a name 008 renamed: its old callers must not reach the endpoint whose id it spells
        IF EXISTS (SELECT 1 FROM webhooks.endpoint_renamed_names r WHERE r.name = p_ref) THEN
            RETURN NULL;
        END IF;
        RETURN (SELECT e.id FROM webhooks.endpoints e
                WHERE e.id = p_ref::bigint AND (v_tenant IS NULL OR e.tenant_id = v_tenant));
    END IF;
    SELECT array_agg(DISTINCT found.id ORDER BY found.id) INTO v_found
    FROM (
        SELECT e.id FROM webhooks.endpoints e
        WHERE e.name = p_ref AND (v_tenant IS NULL OR e.tenant_id = v_tenant)
        UNION ALL
        -- `tenant/name`, split at each slash (a tenant's name may hold one too)
        SELECT e.id
        FROM generate_series(2, length(p_ref) - 1) AS slash(at)
        JOIN webhooks.tenants t ON t.name = left(p_ref, slash.at - 1)
        JOIN webhooks.endpoints e ON e.name = substr(p_ref, slash.at + 1) AND e.tenant_id = t.id
        WHERE strpos(p_ref, '/') > 0 AND substr(p_ref, slash.at, 1) = '/'
          AND (v_tenant IS NULL OR e.tenant_id = v_tenant)
    ) found;
    IF cardinality(v_found) > 1 THEN
        RAISE EXCEPTION '% names an endpoint in more than one tenant (%): give its id or tenant/name',
            quote_literal(p_ref),
            (SELECT string_agg(t.name, ', ' ORDER BY t.name) FROM webhooks.endpoints e
             JOIN webhooks.tenants t ON t.id = e.tenant_id WHERE e.id = ANY (v_found))
            USING ERRCODE = 'too_many_rows',
                  HINT = 'give the endpoint''s id, or its tenant''s name, a slash and its name';
    END IF;
    RETURN v_found[1];
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.endpoint_ref(text) TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;

-- Operational events: an endpoint's state changes, queued through the gate (queue_deliveries(),
-- functions/enqueue.sql) for the endpoints that subscribe to their type explicitly ('*' does not
-- include them), never for the endpoint the event is about, so an event cannot loop back to its
-- cause. An event names the endpoint, the reason and who decided it: it goes only to the endpoint's
-- own tenant, and to the endpoints the operator marked operational_all_tenants (whose tenant then
-- holds every tenant's events: keep them in one only operators read). A subscriber that is
-- disabled keeps it as a dead letter when no subscriber of its tenant is enabled, as any message.
CREATE OR REPLACE FUNCTION webhooks.operational_event_type(p_change text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_change
        WHEN 'disabled' THEN 'webhook.endpoint.disabled'
        WHEN 'enabled' THEN 'webhook.endpoint.enabled'
        WHEN 'circuit_opened' THEN 'webhook.circuit.opened'
        WHEN 'circuit_closed' THEN 'webhook.circuit.closed'
        WHEN 'dead_letters' THEN 'webhook.endpoint.dead_letters'
        WHEN 'secret_rotated' THEN 'webhook.endpoint.secret_rotated'
    END;
$$;

CREATE OR REPLACE FUNCTION webhooks.publish_operational(p_event_row bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    ev record;
    v_type text;
    v_event_id text;
BEGIN
    SELECT x.*, e.name AS endpoint_name, e.tenant_id, t.name AS tenant INTO ev
    FROM webhooks.endpoint_events x
    JOIN webhooks.endpoints e ON e.id = x.webhook_id
    JOIN webhooks.tenants t ON t.id = e.tenant_id
    WHERE x.id = p_event_row;
    v_type := webhooks.operational_event_type(ev.change);
    IF v_type IS NULL THEN
        RETURN 0;
    END IF;
    v_event_id := webhooks.published_event_id(v_type, 'endpoint_events:' || ev.id);
    RETURN (SELECT count(*) FILTER (WHERE g.created)
            FROM webhooks.queue_deliveries(ARRAY[ROW(
                1, NULL, v_type, v_event_id, v_event_id,
                jsonb_build_object(
                    'title', format('Endpoint %s: %s', ev.endpoint_name, replace(ev.change, '_', ' ')),
                    'severity', CASE WHEN ev.change IN ('enabled', 'circuit_closed', 'secret_rotated') THEN 'info'
                                     ELSE 'warning' END,
                    'source', 'webhook-worker',
                    'endpoint_id', ev.webhook_id, 'endpoint_name', ev.endpoint_name, 'tenant', ev.tenant,
                    'change', ev.change, 'reason', ev.reason, 'decided_by', ev.decided_by,
                    'delivery_id', ev.delivery_id, 'at', ev.at),
                NULL, 'endpoint_events:' || ev.id, 10, NULL, NULL, NULL, NULL, NULL,
                -- its endpoint's tenant (and the endpoints marked operational_all_tenants), never itself
                ev.tenant_id, ev.webhook_id, NULL, NULL)::webhooks.delivery_request], 'worker') g);
END;
$$;

CREATE OR REPLACE FUNCTION webhooks.record_endpoint_event(
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

CREATE OR REPLACE FUNCTION webhooks.disable_endpoint(
    p_webhook_id bigint, p_reason text, p_decided_by text DEFAULT 'operator',
    p_delivery_id bigint DEFAULT NULL, p_attempt integer DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    IF NOT webhooks.caller_sees_endpoint(p_webhook_id) THEN
        RETURN NULL;
    END IF;
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
GRANT EXECUTE ON FUNCTION webhooks.disable_endpoint(bigint, text, text, bigint, integer)
    TO webhooks_admin, webhooks_tenant_admin;

-- Enabling also resets the circuit, the pause and the failure streak: the operator says the
-- receiver is back. Rows that waited are claimable at once. p_reason: why, recorded with the change.
CREATE OR REPLACE FUNCTION webhooks.enable_endpoint(p_webhook_id bigint, p_decided_by text DEFAULT 'operator',
                                                    p_reason text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    IF NOT webhooks.caller_sees_endpoint(p_webhook_id) THEN
        RETURN NULL;
    END IF;
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
    RETURN webhooks.record_endpoint_event(p_webhook_id, 'enabled', p_reason, p_decided_by);
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.enable_endpoint(bigint, text, text) TO webhooks_admin, webhooks_tenant_admin;

-- Manual circuit control: 'reset' (closed, counters cleared), 'open' (forced open until p_until,
-- or until reset), 'close' (forced closed: never opens by itself until reset). p_reason: why,
-- recorded with the change.
CREATE OR REPLACE FUNCTION webhooks.set_circuit(
    p_webhook_id bigint, p_action text, p_until timestamptz DEFAULT NULL,
    p_decided_by text DEFAULT 'operator', p_reason text DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_change text;
    v_found boolean;
BEGIN
    IF NOT webhooks.caller_sees_endpoint(p_webhook_id) THEN
        RAISE EXCEPTION 'set_circuit: no endpoint %', p_webhook_id USING ERRCODE = 'no_data_found';
    END IF;
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
        p_webhook_id, v_change, nullif(concat_ws('; ', p_reason, 'until ' || p_until), ''), p_decided_by);
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.set_circuit(bigint, text, timestamptz, text, text)
    TO webhooks_admin, webhooks_tenant_admin;

-- How long a row keeps being retried: the schedule's delays for max_attempts - 1 retries.
CREATE OR REPLACE FUNCTION webhooks.retry_window(p_schedule jsonb, p_max_attempts integer) RETURNS interval
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
-- (reason 'endpoint disabled', category 'disabled') that can be replayed. Bounded per call;
-- returns how many.
CREATE OR REPLACE FUNCTION webhooks.expire_disabled_endpoint_rows(p_limit integer DEFAULT 1000) RETURNS integer
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
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
        SET status = 'dead_letter', dead_letter_reason = 'endpoint disabled', failure_category = 'disabled',
            dead_lettered_at = now(), updated_at = now()
        FROM expired x WHERE q.delivery_id = x.delivery_id
        RETURNING q.delivery_id, q.webhook_id, q.attempts
    ), logged AS (
        INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome, failure_category, error)
        SELECT delivery_id, webhook_id, attempts, 'dead_letter', 'disabled', 'endpoint disabled' FROM dead
        RETURNING 1
    )
    SELECT count(*)::integer FROM logged;
$$;
GRANT EXECUTE ON FUNCTION webhooks.expire_disabled_endpoint_rows(integer) TO webhooks_worker;

-- Signing secrets: Standard Webhooks' 'whsec_' and the base64 of 24 to 64 bytes, the rule of the
-- CLI and the API (secret_problem() in worker/rules/signing.py). Of that, PostgreSQL can check a secret
-- in plaintext (stored before sealing existed, or written at psql) whole. One sealed by the worker
-- side ('enc:v1:<key id>:<base64url>', AES-256-GCM with a key PostgreSQL never sees: a 12-byte
-- nonce and a 16-byte tag around the secret's text, worker/encryption.py) only by its length,
-- which is the length of the text inside: 38 to 94 characters. That refuses 'nope' or a 1-byte key
-- however it is stored, but not a sealed 22-, 23-, 65- or 66-byte key (base64 as long as an
-- allowed one's) nor sealed text of the right length that is no base64.
-- NULL when the secret passes, else why not; never the secret itself.
CREATE OR REPLACE FUNCTION webhooks.signing_secret_problem(p_secret text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_bytes integer;
BEGIN
    IF p_secret IS NULL THEN
        RETURN 'missing';
    ELSIF starts_with(p_secret, 'enc:v1:') THEN
        BEGIN
            v_bytes := octet_length(decode(translate(split_part(p_secret, ':', 4), '-_', '+/'), 'base64')) - 28;
        EXCEPTION WHEN invalid_parameter_value THEN  -- decode()'s error for what is not base64
            RETURN 'sealed, but its envelope is not base64';
        END;
        IF v_bytes NOT BETWEEN 38 AND 94 THEN
            RETURN format('sealed, and its text is %s bytes long: whsec_ and the base64 of 24 to 64 bytes '
                          'is 38 to 94', v_bytes);
        END IF;
    ELSIF NOT starts_with(p_secret, 'whsec_') THEN
        RETURN 'it does not start with whsec_';
    ELSIF substr(p_secret, 7) !~ '^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$' THEN
        RETURN 'what follows whsec_ is not base64';
    ELSE
        v_bytes := octet_length(decode(substr(p_secret, 7), 'base64'));
        IF v_bytes NOT BETWEEN 24 AND 64 THEN
            RETURN format('a key of %s bytes, not 24 to 64', v_bytes);
        END IF;
    END IF;
    RETURN NULL;
END;
$$;

-- The secrets as stored ([{"secret": ..., "expires_at": ...}]), or an error naming the problem of
-- the first one that fails signing_secret_problem(). Not IMMUTABLE: the planner must not fold it
-- (and so raise) in a branch that is never taken.
CREATE OR REPLACE FUNCTION webhooks.checked_signing_secrets(p_secrets jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_problem text;
BEGIN
    SELECT p.problem INTO v_problem
    FROM jsonb_array_elements(p_secrets) s,
         LATERAL (SELECT webhooks.signing_secret_problem(s ->> 'secret') AS problem) p
    WHERE p.problem IS NOT NULL
    LIMIT 1;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'signing secret: %', v_problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A signing secret is whsec_ followed by the base64 of 24 to 64 bytes.';
    END IF;
    RETURN p_secrets;
END;
$$;

CREATE OR REPLACE FUNCTION webhooks.register_endpoint(
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
    p_active          boolean DEFAULT true,
    p_tenant          text    DEFAULT NULL,  -- its name; NULL: the `default` tenant, or the caller's
    -- every tenant's operational events, not only its own tenant's (the operator's channel)
    p_operational_all_tenants boolean DEFAULT false
) RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    INSERT INTO webhooks.endpoints
        (name, url, url_display, signing_secrets, event_types, headers, max_attempts, timeout_ms,
         retry_schedule, rate_limit_per_second, rate_limit_burst, max_in_flight, circuit_policy,
         body_format, secret_settings, active, disabled_reason, disabled_at, tenant_id,
         operational_all_tenants)
    VALUES
        (p_name, p_url, p_url_display, webhooks.checked_signing_secrets(p_signing_secrets),
         coalesce(p_event_types, '{*}'),
         coalesce(p_headers, '{}'), p_max_attempts, p_timeout_ms, p_retry_schedule,
         p_rate_limit_per_second, p_rate_limit_burst, p_max_in_flight, coalesce(p_circuit_policy, '{}'),
         coalesce(p_body_format, 'raw'), coalesce(p_secret_settings, '{}'), coalesce(p_active, true),
         CASE WHEN NOT coalesce(p_active, true) THEN 'awaiting verification' END,
         CASE WHEN NOT coalesce(p_active, true) THEN now() END,
         webhooks.registration_tenant(p_tenant), coalesce(p_operational_all_tenants, false))
    RETURNING id;
$$;
GRANT EXECUTE ON FUNCTION webhooks.register_endpoint(text, text, text, jsonb, text[], jsonb, integer, integer,
                                                       jsonb, numeric, integer, integer, jsonb, text, jsonb,
                                                       boolean, text, boolean)
    TO webhooks_admin, webhooks_tenant_admin;

-- Only the operator marks an endpoint for every tenant's operational events: a session scoped to a
-- tenant (webhooks.tenant set, as the API sets it for a scoped token's transaction) is refused,
-- whichever way it writes the row. Unmarking is allowed to anyone who may write the row.
CREATE OR REPLACE FUNCTION webhooks.refuse_scoped_all_tenants() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF nullif(current_setting('webhooks.tenant', true), '') IS NOT NULL
            AND (TG_OP = 'INSERT' OR NOT OLD.operational_all_tenants) THEN
        RAISE EXCEPTION 'operational_all_tenants: only an operator may mark an endpoint for every '
                        'tenant''s operational events, not a session scoped to a tenant'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER refuse_scoped_all_tenants
    BEFORE INSERT OR UPDATE OF operational_all_tenants ON webhooks.endpoints
    FOR EACH ROW WHEN (NEW.operational_all_tenants)
    EXECUTE FUNCTION webhooks.refuse_scoped_all_tenants();

-- Applies the keys present in p_changes (url, url_display, event_types, headers, max_attempts,
-- timeout_ms, retry_schedule, rate_limit_per_second, rate_limit_burst, max_in_flight,
-- circuit_policy, body_format, secret_settings, delivery_ttl, retry_policy, coalesce_max,
-- coalesce_window, operational_all_tenants); a key with a JSON null resets that override.
CREATE OR REPLACE FUNCTION webhooks.update_endpoint(p_webhook_id bigint, p_changes jsonb) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_unknown text;
    v_changes jsonb := p_changes;
    v_set text;
    v_rows integer;
BEGIN
    -- Every column of webhooks.endpoints may be changed by its own name but these, which have
    -- functions of their own (enable/disable, rotate_secret) or never change: a column a migration
    -- adds is changeable here with no edit (the endpoint service's model decides what callers send).
    SELECT k INTO v_unknown FROM jsonb_object_keys(p_changes) k
    WHERE k IN ('id', 'name', 'tenant_id', 'signing_secrets', 'active', 'disabled_reason', 'disabled_at',
                'metadata', 'created_at', 'updated_at')
       OR NOT EXISTS (SELECT 1 FROM pg_attribute a
                      WHERE a.attrelid = 'webhooks.endpoints'::regclass AND a.attname = k
                        AND a.attnum > 0 AND NOT a.attisdropped)
    LIMIT 1;
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION 'update_endpoint: unknown field %', v_unknown;
    END IF;
    IF v_changes -> 'operational_all_tenants' = 'null' THEN  -- JSON null: off
        v_changes := jsonb_set(v_changes, '{operational_all_tenants}', 'false');
    END IF;
    IF v_changes = '{}' THEN
        v_set := '';
    ELSE
        SELECT string_agg(format('%I = r.%I', k, k), ', ') || ', ' INTO v_set
        FROM jsonb_object_keys(v_changes) k;
    END IF;
    -- each value read as its column's type (JSON null: NULL; arrays and intervals from their JSON)
    EXECUTE format('UPDATE webhooks.endpoints e SET %s updated_at = now()'
                   ' FROM jsonb_populate_record(NULL::webhooks.endpoints, $1) r'
                   ' WHERE e.id = $2 AND webhooks.caller_sees_endpoint($2)', v_set)
        USING v_changes, p_webhook_id;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_rows > 0;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.update_endpoint(bigint, jsonb) TO webhooks_admin, webhooks_tenant_admin;

-- Adds p_new_secret as the newest secret (checked: signing_secret_problem()); every secret active
-- now expires at p_old_expire_at (NULL: they stay active until rotated again). Expired secrets are
-- dropped. The rotation is an endpoint event (`secret_rotated`, naming who decided it and when the
-- old secrets stop signing), published as webhook.endpoint.secret_rotated like the other state
-- changes: a receiver whose signatures start failing, or an operator auditing, can tell why.
CREATE OR REPLACE FUNCTION webhooks.rotate_secret(p_webhook_id bigint, p_new_secret text,
                                       p_old_expire_at timestamptz DEFAULT NULL,
                                       p_decided_by text DEFAULT 'operator')
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_count integer;
BEGIN
    PERFORM webhooks.checked_signing_secrets(jsonb_build_array(jsonb_build_object('secret', p_new_secret)));
    UPDATE webhooks.endpoints e SET
        signing_secrets = jsonb_build_array(jsonb_build_object('secret', p_new_secret, 'expires_at', NULL))
            || coalesce((
                SELECT jsonb_agg(CASE WHEN s ->> 'expires_at' IS NULL
                                      THEN jsonb_set(s, '{expires_at}', coalesce(to_jsonb(p_old_expire_at), 'null'))
                                      ELSE s END)
                FROM jsonb_array_elements(e.signing_secrets) s
                WHERE s ->> 'expires_at' IS NULL OR (s ->> 'expires_at')::timestamptz > now()), '[]'),
        updated_at = now()
    WHERE e.id = p_webhook_id AND webhooks.caller_sees_endpoint(p_webhook_id)
    RETURNING jsonb_array_length(e.signing_secrets) INTO v_count;
    IF v_count IS NOT NULL THEN
        PERFORM webhooks.record_endpoint_event(
            p_webhook_id, 'secret_rotated',
            CASE WHEN p_old_expire_at IS NULL THEN 'the earlier secrets keep signing until the next rotation'
                 ELSE 'the earlier secrets sign until ' || to_char(p_old_expire_at AT TIME ZONE 'UTC',
                                                                 'YYYY-MM-DD HH24:MI:SS "UTC"') END,
            p_decided_by);
    END IF;
    RETURN v_count;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.rotate_secret(bigint, text, timestamptz, text)
    TO webhooks_admin, webhooks_tenant_admin;

-- The key id each stored credential is sealed with ('plaintext' for values stored before sealing).
CREATE OR REPLACE FUNCTION webhooks.credential_keys()
RETURNS TABLE (key_id text, credentials bigint)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    WITH stored AS (
        SELECT e.url AS value FROM webhooks.endpoints e
        UNION ALL
        SELECT s ->> 'secret' FROM webhooks.endpoints e, jsonb_array_elements(e.signing_secrets) s
        UNION ALL
        SELECT v.value FROM webhooks.endpoints e, jsonb_each_text(e.secret_settings) v
        UNION ALL
        SELECT h.value FROM webhooks.endpoints e, jsonb_each_text(e.headers) h
    )
    SELECT CASE WHEN starts_with(value, 'enc:v1:') THEN split_part(value, ':', 3) ELSE 'plaintext' END,
           count(*)
    FROM stored
    GROUP BY 1
    ORDER BY 1;
$$;
GRANT EXECUTE ON FUNCTION webhooks.credential_keys() TO webhooks_worker;

-- A page of endpoints' credentials, locked against concurrent changes until the caller commits
-- (FOR NO KEY UPDATE: producers inserting rows for these endpoints are not blocked). Sealed: the
-- caller opens them with the keys (worker/rules/self_service.py reads an endpoint's signing secrets so).
-- A session kept to a tenant gets that tenant's endpoints only.
CREATE OR REPLACE FUNCTION webhooks.endpoint_credentials(p_after_id bigint, p_limit integer)
RETURNS TABLE (id bigint, url text, signing_secrets jsonb, secret_settings jsonb, headers jsonb)
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT e.id, e.url, e.signing_secrets, e.secret_settings, e.headers
    FROM webhooks.endpoints e, (SELECT webhooks.caller_tenant() AS id) t
    WHERE e.id > p_after_id AND (t.id IS NULL OR e.tenant_id = t.id)
    ORDER BY e.id
    LIMIT p_limit
    FOR NO KEY UPDATE;
$$;
GRANT EXECUTE ON FUNCTION webhooks.endpoint_credentials(bigint, integer) TO webhooks_admin, webhooks_tenant_admin;

-- An endpoint's credentials sealed: its first ones at registration, or all of them again (keys
-- rotate). An endpoint's first signing secrets are checked (signing_secret_problem()); re-sealed
-- ones are not, so that a secret stored before the rule existed cannot stop a key rotation.
CREATE OR REPLACE FUNCTION webhooks.store_endpoint_credentials(
    p_id bigint, p_url text, p_signing_secrets jsonb, p_secret_settings jsonb, p_headers jsonb
) RETURNS void
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    UPDATE webhooks.endpoints
    SET url = p_url,
        signing_secrets = CASE WHEN jsonb_array_length(signing_secrets) = 0
                               THEN webhooks.checked_signing_secrets(p_signing_secrets)
                               ELSE p_signing_secrets END,
        secret_settings = p_secret_settings, headers = p_headers
    WHERE id = p_id AND webhooks.caller_sees_endpoint(p_id);
$$;
GRANT EXECUTE ON FUNCTION webhooks.store_endpoint_credentials(bigint, text, jsonb, jsonb, jsonb)
    TO webhooks_admin, webhooks_tenant_admin;

CREATE OR REPLACE VIEW webhooks.endpoint_summary AS
SELECT e.id, e.name, e.url_display, e.active, e.disabled_reason, e.event_types,
       jsonb_array_length(e.signing_secrets) AS secrets, e.body_format, e.max_attempts, e.timeout_ms,
       e.created_at, h.health_status, h.total_attempts, h.successes, h.failures,
       h.consecutive_failures, h.last_success_at, h.last_failure_at, h.circuit_state,
       h.circuit_open_until, h.paused_until, e.rate_limit_per_second, e.rate_limit_burst,
       e.max_in_flight, e.coalesce_max, e.coalesce_window, e.tenant_id, t.name AS tenant,
       e.operational_all_tenants, e.retry_schedule, e.delivery_ttl, e.description
FROM webhooks.endpoints e
JOIN webhooks.tenants t ON t.id = e.tenant_id
LEFT JOIN webhooks.webhook_health_metrics h ON h.webhook_id = e.id
-- a view runs as its owner, whom row-level security does not bind: it applies the tenant itself
WHERE (SELECT webhooks.caller_tenant()) IS NULL OR e.tenant_id = (SELECT webhooks.caller_tenant());
GRANT SELECT ON webhooks.endpoint_summary TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;
