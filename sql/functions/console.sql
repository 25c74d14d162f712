-- console: the operator console's server-side sessions.
--
-- A person logs in with an API token (reader or admin); the console then keeps a session so the
-- token is typed once. A session is usable only while its token is: console_session() calls
-- api_token_role() on every request, so revoking or expiring the token ends its sessions at once,
-- with nothing cached. Expired rows are removed when a new session starts, so the table stays as
-- small as the number of people logged in.
--
-- Every function is SECURITY DEFINER with a fixed search_path and granted to
-- webhooks_authenticator alone: the API's login calls them between requests, as it does
-- api_token_role().

-- Opens a session for a token that is usable now; returns its name and role (no row, and no
-- session, for an unknown, revoked or expired token).
CREATE FUNCTION webhooks.console_start_session(p_session_hash bytea, p_token_hash bytea, p_lifetime interval)
RETURNS TABLE (name text, role text, tenant_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    IF p_lifetime IS NULL OR p_lifetime <= interval '0' OR p_lifetime > interval '7 days' THEN
        RAISE EXCEPTION 'console_start_session: p_lifetime must be more than 0 and at most 7 days, got %',
            p_lifetime USING ERRCODE = 'invalid_parameter_value';
    END IF;
    DELETE FROM webhooks.console_sessions s WHERE s.expires_at <= now();
    RETURN QUERY
    WITH usable AS (
        SELECT t.name, t.role, t.tenant_id FROM webhooks.api_token_role(p_token_hash) t
    ), opened AS (
        INSERT INTO webhooks.console_sessions (session_hash, token_hash, expires_at)
        SELECT p_session_hash, p_token_hash, now() + p_lifetime FROM usable
        RETURNING 1
    )
    SELECT u.name, u.role, u.tenant_id FROM usable u, opened;
END;
$$;

-- The caller behind a session: no row once the session expired or ended, or its token was revoked
-- or expired.
CREATE FUNCTION webhooks.console_session(p_session_hash bytea)
RETURNS TABLE (name text, role text, tenant_id bigint)
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT t.name, t.role, t.tenant_id
    FROM webhooks.console_sessions s
    CROSS JOIN LATERAL webhooks.api_token_role(s.token_hash) t
    WHERE s.session_hash = p_session_hash AND s.expires_at > now();
$$;

-- Logout. Whether a session was ended.
CREATE FUNCTION webhooks.console_end_session(p_session_hash bytea) RETURNS boolean
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    WITH ended AS (
        DELETE FROM webhooks.console_sessions s WHERE s.session_hash = p_session_hash RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM ended);
$$;

REVOKE ALL ON FUNCTION
    webhooks.console_start_session(bytea, bytea, interval),
    webhooks.console_session(bytea),
    webhooks.console_end_session(bytea)
FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    webhooks.console_start_session(bytea, bytea, interval),
    webhooks.console_session(bytea),
    webhooks.console_end_session(bytea)
TO webhooks_authenticator;

-- Portal links (migration 017): a one-time link that opens a session as a tenant's administrator.
-- The link is backed by a tenant_admin token of its own, named portal:TENANT:xxxxxxxx, whose
-- secret nobody holds (only p_token_hash, of random bytes, is given): the session checks that token
-- on every request as any other, so it ends with the link's expiry or the token's revocation.
-- p_lifetime: how long the link, and so its session, lasts (more than 0, at most a day).
CREATE FUNCTION webhooks.create_portal_link(p_tenant text, p_link_hash bytea, p_token_hash bytea,
                                            p_lifetime interval)
RETURNS TABLE (token_name text, tenant text, expires_at timestamptz)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_tenant bigint := webhooks.tenant_id(p_tenant);  -- raises no_data_found for an unknown name
    v_expires timestamptz := now() + p_lifetime;
    v_name text := format('portal:%s:%s', p_tenant, left(encode(p_link_hash, 'hex'), 8));
    v_token bigint;
BEGIN
    IF p_lifetime IS NULL OR p_lifetime <= interval '0' OR p_lifetime > interval '1 day' THEN
        RAISE EXCEPTION 'create_portal_link: p_lifetime must be more than 0 and at most 1 day, got %',
            p_lifetime USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO webhooks.api_tokens (name, role, token_hash, expires_at, tenant_id)
    VALUES (v_name, 'tenant_admin', p_token_hash, v_expires, v_tenant)
    RETURNING id INTO v_token;
    INSERT INTO webhooks.portal_links (link_hash, token_id, expires_at) VALUES (p_link_hash, v_token, v_expires);
    RETURN QUERY SELECT v_name, p_tenant, v_expires;
END;
$$;

-- Opens the session a portal link stands for, once: the link is marked used whatever follows, and
-- no row (no session) comes back for an unknown, used or expired link, or one whose token was revoked.
-- The session lasts as long as the link would have.
CREATE FUNCTION webhooks.console_open_portal_link(p_link_hash bytea, p_session_hash bytea)
RETURNS TABLE (name text, role text, tenant_id bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_token_hash bytea;
    v_expires timestamptz;
BEGIN
    DELETE FROM webhooks.console_sessions s WHERE s.expires_at <= now();
    UPDATE webhooks.portal_links l SET used_at = now()
    FROM webhooks.api_tokens t
    WHERE l.link_hash = p_link_hash AND l.used_at IS NULL AND l.expires_at > now() AND t.id = l.token_id
    RETURNING t.token_hash, l.expires_at INTO v_token_hash, v_expires;
    IF v_token_hash IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH usable AS (
        SELECT r.name, r.role, r.tenant_id FROM webhooks.api_token_role(v_token_hash) r
    ), opened AS (
        INSERT INTO webhooks.console_sessions (session_hash, token_hash, expires_at)
        SELECT p_session_hash, v_token_hash, v_expires FROM usable
        RETURNING 1
    )
    SELECT u.name, u.role, u.tenant_id FROM usable u, opened;
END;
$$;

REVOKE ALL ON FUNCTION
    webhooks.create_portal_link(text, bytea, bytea, interval),
    webhooks.console_open_portal_link(bytea, bytea)
FROM PUBLIC;
-- an (unscoped) admin makes links over the API; the CLI runs as the owner
GRANT EXECUTE ON FUNCTION webhooks.create_portal_link(text, bytea, bytea, interval) TO webhooks_admin;
GRANT EXECUTE ON FUNCTION webhooks.console_open_portal_link(bytea, bytea) TO webhooks_authenticator;
