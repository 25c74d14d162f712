-- 020_tenant_networks: the private networks the operator grants a tenant's endpoints.
--
-- security.allow_networks, in the workers' configuration, is the operator's: the networks of its
-- own receivers. Endpoints of any tenant but `default` (the operator's own) reach public
-- destinations plus the networks listed here for their tenant, never the operator's list
-- (worker/destinations.py decides; `webhook-worker tenants update acme --allow-networks
-- 10.1.0.0/16` or webhooks.update_tenant('acme', '{"allow_networks": ["10.1.0.0/16"]}') sets them).
-- Empty: public destinations only. The claim returns each row's tenant's networks, so a worker
-- applies a change from its next claim on.

ALTER TABLE webhooks.tenants
    ADD COLUMN allow_networks cidr[] NOT NULL DEFAULT '{}'
        CONSTRAINT tenant_allow_networks_bounded
        CHECK (cardinality(allow_networks) <= 100 AND array_position(allow_networks, NULL) IS NULL);
