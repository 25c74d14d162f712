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
