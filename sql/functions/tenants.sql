-- tenants: the teams or customers one deployment serves (the table: migrations/005_tenants.sql).
--
--   SELECT webhooks.register_tenant('acme', '{"rate_limit_per_second": 50, "max_endpoints": 20}');
--   SELECT webhooks.update_tenant('acme', '{"max_in_flight": 10, "max_queued": null}');
--   SELECT * FROM webhooks.tenant_summary;
--
-- Limits (each NULL for none): rate_limit_per_second and rate_limit_burst (requests per second
-- across all the tenant's endpoints), max_in_flight (requests), max_endpoints (registration refuses
-- more, whoever inserts), max_queued (rows waiting or in flight: the API's publish refuses more with
-- 429; a producer inserting through SQL is never refused, its rows wait under the rate limit).
-- allow_networks (a list of CIDRs; null or [] for none): the private networks the operator grants
-- the tenant's endpoints besides public destinations (worker/rules/destinations.py; the `default`
-- tenant's endpoints are the operator's and reach security.allow_networks as well).
-- The claim enforces the first three fleet-wide (acquire() in claim.sql). Every audit row carries
-- its endpoint's tenant (finish() writes it, fill_log_tenant fills it for the other writers), as
-- every queue row does (fill_idempotency_key).
-- The name `other` is reserved: the metrics label the tenants past their label limit so.
-- register_tenant() and update_tenant() are granted to webhooks_admin (the HTTP API's admin
-- requests), which writes no table itself; never to webhooks_tenant_admin, whose session reads its
-- own tenant's row only.

-- A tenant's id by name; an unknown name is an error that names it.
CREATE OR REPLACE FUNCTION webhooks.tenant_id(p_name text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_id bigint;
BEGIN
    SELECT t.id INTO v_id FROM webhooks.tenants t WHERE t.name = p_name;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'tenant: no tenant named %', coalesce(quote_literal(p_name), 'NULL')
            USING ERRCODE = 'no_data_found', HINT = 'webhook-worker tenants list shows them';
    END IF;
    RETURN v_id;
END;
$$;

-- The tenant a new endpoint goes to: the one named (NULL: `default`) or, for a session kept to a
-- tenant (caller_tenant()), that one, which it may name but not another.
CREATE OR REPLACE FUNCTION webhooks.registration_tenant(p_name text) RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_scoped bigint := webhooks.caller_tenant();
BEGIN
    IF v_scoped IS NULL THEN
        RETURN webhooks.tenant_id(coalesce(p_name, 'default'));
    END IF;
    -- the name given is compared, never looked up: the answer says nothing of other tenants
    IF p_name IS NOT NULL AND p_name IS DISTINCT FROM (SELECT t.name FROM webhooks.tenants t WHERE t.id = v_scoped) THEN
        RAISE EXCEPTION 'tenant: a session kept to one tenant registers endpoints in that tenant only'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN v_scoped;
END;
$$;

-- The limits of p_limits applied to the tenant's row; an unknown key is an error naming it.
CREATE OR REPLACE FUNCTION webhooks.set_tenant_limits(p_tenant_id bigint, p_limits jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_unknown text;
BEGIN
    IF jsonb_typeof(coalesce(p_limits, '{}')) <> 'object' THEN
        RAISE EXCEPTION 'tenant limits: expected a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT k INTO v_unknown FROM jsonb_object_keys(coalesce(p_limits, '{}')) k
    WHERE k NOT IN ('rate_limit_per_second', 'rate_limit_burst', 'max_in_flight', 'max_endpoints', 'max_queued',
                    'allow_networks')
    LIMIT 1;
    IF v_unknown IS NOT NULL THEN
        RAISE EXCEPTION 'tenant limits: unknown field %', v_unknown USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF jsonb_typeof(p_limits -> 'allow_networks') NOT IN ('array', 'null') THEN
        RAISE EXCEPTION 'tenant limits: allow_networks must be a list of CIDRs'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    UPDATE webhooks.tenants t SET
        rate_limit_per_second = CASE WHEN p_limits ? 'rate_limit_per_second'
            THEN (p_limits ->> 'rate_limit_per_second')::numeric ELSE t.rate_limit_per_second END,
        rate_limit_burst = CASE WHEN p_limits ? 'rate_limit_burst'
            THEN (p_limits ->> 'rate_limit_burst')::integer ELSE t.rate_limit_burst END,
        max_in_flight = CASE WHEN p_limits ? 'max_in_flight'
            THEN (p_limits ->> 'max_in_flight')::integer ELSE t.max_in_flight END,
        max_endpoints = CASE WHEN p_limits ? 'max_endpoints'
            THEN (p_limits ->> 'max_endpoints')::integer ELSE t.max_endpoints END,
        max_queued = CASE WHEN p_limits ? 'max_queued'
            THEN (p_limits ->> 'max_queued')::bigint ELSE t.max_queued END,
        -- cidr refuses what is not a network (host bits set included): the CLI and the API give
        -- each entry as its network (worker/rules/destinations.py, granted_networks())
        allow_networks = CASE WHEN p_limits ? 'allow_networks'
            THEN ARRAY(SELECT DISTINCT n::cidr FROM jsonb_array_elements_text(
                           coalesce(nullif(p_limits -> 'allow_networks', 'null'), '[]')) n ORDER BY 1)
            ELSE t.allow_networks END,
        -- a changed rate starts from a full bucket
        rate_tokens = CASE WHEN p_limits ? 'rate_limit_per_second' OR p_limits ? 'rate_limit_burst'
            THEN NULL ELSE t.rate_tokens END,
        updated_at = now()
    WHERE t.id = p_tenant_id;
END;
$$;

CREATE OR REPLACE FUNCTION webhooks.register_tenant(p_name text, p_limits jsonb DEFAULT '{}') RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    -- `other` labels the tenants past the metrics' label limit: a tenant of that name would be
    -- counted as if it were the rest (worker/observability.py)
    IF p_name = 'other' THEN
        RAISE EXCEPTION 'tenant name %: reserved (it labels the tenants past the metrics label limit)',
            quote_literal(p_name) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO webhooks.tenants (name) VALUES (p_name) RETURNING id INTO v_id;
    PERFORM webhooks.set_tenant_limits(v_id, p_limits);
    RETURN v_id;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.register_tenant(text, jsonb) TO webhooks_admin;

CREATE OR REPLACE FUNCTION webhooks.update_tenant(p_name text, p_limits jsonb) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_id bigint := webhooks.tenant_id(p_name);
BEGIN
    PERFORM webhooks.set_tenant_limits(v_id, p_limits);
    RETURN v_id;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.update_tenant(text, jsonb) TO webhooks_admin;

-- max_endpoints holds however an endpoint is inserted: the tenant's row is locked, so two
-- registrations at once cannot both take the last place.
CREATE OR REPLACE FUNCTION webhooks.check_tenant_endpoints() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_max   integer;
    v_name  text;
    v_count bigint;
BEGIN
    SELECT t.max_endpoints, t.name INTO v_max, v_name FROM webhooks.tenants t
    WHERE t.id = NEW.tenant_id FOR UPDATE;
    IF v_max IS NOT NULL THEN
        SELECT count(*) INTO v_count FROM webhooks.endpoints e WHERE e.tenant_id = NEW.tenant_id;
        IF v_count >= v_max THEN
            RAISE EXCEPTION 'tenant %: at its limit of % endpoints', v_name, v_max
                USING ERRCODE = 'check_violation', CONSTRAINT = 'tenant_max_endpoints';
        END IF;
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER check_tenant_endpoints
    BEFORE INSERT OR UPDATE OF tenant_id ON webhooks.endpoints
    FOR EACH ROW EXECUTE FUNCTION webhooks.check_tenant_endpoints();

-- Every audit row carries its endpoint's tenant, whichever function writes it. finish(), which
-- writes a row per attempt, reads the endpoint anyway and writes its tenant itself; this trigger
-- fills the rows that leave it NULL (the column has no default, migrations/019_lean_audit_rows.sql),
-- so the hot path pays no trigger call per row (a tenth of finish()'s PostgreSQL CPU) and a writer
-- that forgets the tenant still gets the endpoint's, never a default one.
CREATE OR REPLACE FUNCTION webhooks.fill_log_tenant() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_tenant bigint;
BEGIN
    SELECT e.tenant_id INTO v_tenant FROM webhooks.endpoints e WHERE e.id = NEW.webhook_id;
    -- an endpoint deleted since (its audit rows are kept): the default tenant, as before
    NEW.tenant_id := coalesce(v_tenant, 1);
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER fill_log_tenant
    BEFORE INSERT ON webhooks.alert_delivery_log
    FOR EACH ROW WHEN (NEW.tenant_id IS NULL) EXECUTE FUNCTION webhooks.fill_log_tenant();

-- What an operator sees of each tenant: its limits, what it has now, and the networks granted it.
CREATE OR REPLACE VIEW webhooks.tenant_summary AS
SELECT t.id, t.name, t.rate_limit_per_second, t.rate_limit_burst, t.max_in_flight, t.max_endpoints,
       t.max_queued, t.created_at,
       (SELECT count(*) FROM webhooks.endpoints e WHERE e.tenant_id = t.id) AS endpoints,
       (SELECT count(*) FROM webhooks.alert_delivery_queue q
        WHERE q.tenant_id = t.id AND q.status IN ('pending', 'retrying')) AS waiting,
       (SELECT count(*) FROM webhooks.alert_delivery_queue q
        WHERE q.tenant_id = t.id AND q.status = 'delivering') AS in_flight,
       (SELECT count(*) FROM webhooks.alert_delivery_queue q
        WHERE q.tenant_id = t.id AND q.status = 'dead_letter') AS dead_letters,
       t.allow_networks::text[] AS allow_networks
FROM webhooks.tenants t
-- a view runs as its owner, whom row-level security does not bind: it applies the tenant itself
WHERE (SELECT webhooks.caller_tenant()) IS NULL OR t.id = (SELECT webhooks.caller_tenant());
GRANT SELECT ON webhooks.tenant_summary TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;

-- Where an endpoint may deliver beyond public destinations, for the check at registration and at a
-- change of URL (worker/rules/endpoints.py; the worker checks again at every connection, with the
-- networks acquire() returns): the tenant a new endpoint goes to (p_tenant, as
-- registration_tenant() picks it: NULL is `default`, or a scoped caller's own) or, given
-- p_webhook_id, the tenant of that endpoint if the caller sees it (else no row), and the networks
-- granted to it. Its errors are registration's: no such tenant (no_data_found), another tenant
-- than a scoped caller's own (insufficient_privilege).
CREATE OR REPLACE FUNCTION webhooks.tenant_destinations(p_tenant text, p_webhook_id bigint DEFAULT NULL)
RETURNS TABLE (tenant text, allow_networks text[])
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_tenant bigint;
BEGIN
    IF p_webhook_id IS NULL THEN
        v_tenant := webhooks.registration_tenant(p_tenant);
    ELSE
        SELECT e.tenant_id INTO v_tenant FROM webhooks.endpoints e
        WHERE e.id = p_webhook_id AND webhooks.caller_sees_endpoint(e.id);
    END IF;
    RETURN QUERY SELECT t.name, t.allow_networks::text[] FROM webhooks.tenants t WHERE t.id = v_tenant;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.tenant_destinations(text, bigint) TO webhooks_admin, webhooks_tenant_admin;
