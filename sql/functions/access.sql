-- access: the tenant a session is kept to, for the views and the SECURITY DEFINER functions that
-- row-level security does not bind (they run as the owner).
--
-- A scoped API request sets webhooks.tenant for its transaction (worker/store/database.py); the policies
-- of migrations/005_tenants.sql bind the group roles by it, and what runs as the owner applies it
-- itself through caller_tenant(). A tenant administrator (webhooks_tenant_admin) is never every
-- tenant's: without the setting it is refused here, as the restrictive policies of
-- migrations/015_self_service.sql show it no row, so a request that forgot the setting changes
-- nothing rather than everything.
--
-- The acting role is the one the session SET (SET LOCAL ROLE, as the API does), or its login when it
-- set none: a SECURITY DEFINER function changes current_user to the owner but not the `role`
-- setting, so this answers the same inside one. The owner, the worker, producers, readers and admins
-- do not hold webhooks_tenant_admin alone and keep the old meaning: unset is every tenant.

CREATE OR REPLACE FUNCTION webhooks.caller_tenant() RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_tenant bigint := nullif(current_setting('webhooks.tenant', true), '')::bigint;
    v_role name;
BEGIN
    IF v_tenant IS NULL THEN
        v_role := CASE WHEN current_setting('role') = 'none' THEN session_user ELSE current_setting('role') END;
        IF pg_has_role(v_role, 'webhooks_tenant_admin', 'USAGE')
                AND NOT pg_has_role(v_role, 'webhooks_admin', 'USAGE') THEN
            RAISE EXCEPTION 'a tenant administrator''s session must set webhooks.tenant to its tenant'
                USING ERRCODE = 'insufficient_privilege';
        END IF;
    END IF;
    RETURN v_tenant;
END;
$$;
-- The views call it as their reader (a view's functions run as whoever reads it).
GRANT EXECUTE ON FUNCTION webhooks.caller_tenant() TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;

-- Whether the caller may act on this endpoint: it exists and, for a session kept to a tenant, is
-- that tenant's. Another tenant's endpoint is answered as a missing one is.
CREATE OR REPLACE FUNCTION webhooks.caller_sees_endpoint(p_webhook_id bigint) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM webhooks.endpoints e, (SELECT webhooks.caller_tenant() AS id) t
                   WHERE e.id = p_webhook_id AND (t.id IS NULL OR e.tenant_id = t.id));
$$;
