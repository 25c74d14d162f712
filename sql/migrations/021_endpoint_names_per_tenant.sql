-- 021_endpoint_names_per_tenant: an endpoint's name is unique within its tenant, not across tenants.
--
-- Unique across tenants, a name told one tenant's administrator which names another tenant holds
-- (409 "an endpoint named 'globex-hook' exists") and let it take names another tenant would want.
-- The same name may now stand in several tenants; a caller kept to a tenant names its own, and an
-- unscoped caller naming one that several tenants hold is asked for its id or `tenant/name`
-- (webhooks.endpoint_ref(), functions/endpoints.sql). The index leads with the name, so a lookup
-- by name alone (an unscoped caller's) still uses it.

ALTER TABLE webhooks.endpoints
    DROP CONSTRAINT endpoints_name_key,
    ADD CONSTRAINT endpoints_name_tenant_key UNIQUE (name, tenant_id);
