-- 006_operational_events_tenant: operational events stay inside the tenant they are about.
--
-- An operational event ('webhook.endpoint.*', 'webhook.circuit.*') says what happened to an
-- endpoint and why, and who decided it; it is queued only for the subscribers in that endpoint's
-- tenant (publish_operational() in functions/endpoints.sql). An endpoint marked
-- operational_all_tenants receives every tenant's as well: the operator's own channel. Only the
-- operator sets the mark (the CLI, an admin token; a session scoped to a tenant is refused, by the
-- refuse_scoped_all_tenants trigger). Every endpoint there is now receives its own tenant's only.

ALTER TABLE webhooks.endpoints ADD COLUMN operational_all_tenants boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN webhooks.endpoints.operational_all_tenants IS
    'Receives the operational events of every tenant''s endpoints (false: of its own tenant''s only)';
