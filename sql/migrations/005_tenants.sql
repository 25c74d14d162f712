-- 005_tenants: tenants, the boundary between the teams or customers one deployment serves.
--
-- Every endpoint belongs to one tenant, and every queue and audit row carries its endpoint's tenant
-- (set by the insert triggers in functions/enqueue.sql and functions/finish.sql from the endpoint,
-- never taken from a producer), so a tenant's rows can be counted, filtered and shared fairly
-- without a join. A database with no tenants configured has one, `default` (id 1), that every
-- existing endpoint and row belongs to: nobody has to mention tenants, and nothing changes.
--
-- A tenant's limits hold across all its endpoints and the whole fleet, as the endpoints' do
-- (acquire() in functions/claim.sql reads and debits them under this row's lock):
-- rate_limit_per_second / rate_limit_burst (requests per second), max_in_flight (requests),
-- max_endpoints (registration refuses more), max_queued (rows waiting or in flight; publishing over
-- the API beyond it is refused with 429, while a producer inserting through SQL is never refused:
-- its rows wait under the rate limit). NULL: no limit.

CREATE TABLE webhooks.tenants (
    id                    bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name                  text        NOT NULL UNIQUE
        CONSTRAINT tenant_name_printable
        CHECK (length(name) BETWEEN 1 AND 100 AND name !~ '[[:cntrl:][:space:]]'),
    rate_limit_per_second numeric     CHECK (rate_limit_per_second > 0),
    rate_limit_burst      integer     CHECK (rate_limit_burst >= 1),
    max_in_flight         integer     CHECK (max_in_flight >= 1),
    max_endpoints         integer     CHECK (max_endpoints >= 0),
    max_queued            bigint      CHECK (max_queued >= 0),
    -- the fleet-wide token bucket of the rate limit, as on webhook_health_metrics
    rate_tokens           double precision,
    rate_refilled_at      timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);  -- the claim updates the bucket columns: keep those updates heap-only

COMMENT ON TABLE webhooks.tenants IS
    'Tenants: the teams or customers one deployment serves, with their fleet-wide limits (NULL: none)';

INSERT INTO webhooks.tenants (id, name) OVERRIDING SYSTEM VALUE VALUES (1, 'default');
ALTER TABLE webhooks.tenants ALTER COLUMN id RESTART WITH 2;

-- Instant (a constant default): every endpoint and row there is now belongs to `default`.
ALTER TABLE webhooks.endpoints
    ADD COLUMN tenant_id bigint NOT NULL DEFAULT 1 REFERENCES webhooks.tenants (id);
CREATE INDEX endpoints_tenant ON webhooks.endpoints (tenant_id);

-- The triggers overwrite these from the endpoint on every insert; the default only makes adding
-- the columns instant. No foreign key on the hot tables: a tenant is never deleted.
ALTER TABLE webhooks.alert_delivery_queue ADD COLUMN tenant_id bigint NOT NULL DEFAULT 1;
ALTER TABLE webhooks.alert_delivery_log ADD COLUMN tenant_id bigint NOT NULL DEFAULT 1;

-- The claim's fairness and the tenant's in-flight count read a tenant's rows by state.
CREATE INDEX alert_delivery_queue_tenant_active ON webhooks.alert_delivery_queue (tenant_id, status)
    WHERE status IN ('pending', 'retrying', 'delivering');

-- The tenants a worker process's pool serves (worker.tenants / worker.exclude_tenants; NULL: all),
-- so that rows no live pool serves can be shown (the held_back view).
ALTER TABLE webhooks.worker_liveness ADD COLUMN tenants text[], ADD COLUMN exclude_tenants text[];

-- API tokens scoped to a tenant (`tokens create --tenant T`): every request of such a token runs
-- with the setting webhooks.tenant set to its tenant's id for that transaction only (set_config(...,
-- true)), and sees and changes only that tenant's rows. NULL: every tenant, as before. Only the
-- producer and reader roles can be scoped: an admin token runs as the schema owner, whom row-level
-- security does not bind.
ALTER TABLE webhooks.api_tokens
    ADD COLUMN tenant_id bigint REFERENCES webhooks.tenants (id),
    ADD CONSTRAINT api_token_tenant_role CHECK (tenant_id IS NULL OR role IN ('producer', 'reader'));

-- Isolation enforced by PostgreSQL, not only by the API's queries: with webhooks.tenant set, a role
-- other than the owner reads and writes only that tenant's rows of these tables. Unset (the
-- worker's functions, producers, dashboards, the operator), nothing is filtered. The owner (and so
-- every SECURITY DEFINER function: the claim, finish) is not bound by these policies (no FORCE),
-- so the hot path pays nothing; the views, which run as the owner, and the SECURITY DEFINER
-- functions a scoped request can call (api_publish) apply the same setting themselves
-- (functions/*.sql).
ALTER TABLE webhooks.endpoints ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhooks.endpoints
    USING (nullif(current_setting('webhooks.tenant', true), '') IS NULL
           OR tenant_id = nullif(current_setting('webhooks.tenant', true), '')::bigint);

ALTER TABLE webhooks.alert_delivery_queue ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhooks.alert_delivery_queue
    USING (nullif(current_setting('webhooks.tenant', true), '') IS NULL
           OR tenant_id = nullif(current_setting('webhooks.tenant', true), '')::bigint);

ALTER TABLE webhooks.alert_delivery_log ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhooks.alert_delivery_log
    USING (nullif(current_setting('webhooks.tenant', true), '') IS NULL
           OR tenant_id = nullif(current_setting('webhooks.tenant', true), '')::bigint);

ALTER TABLE webhooks.tenants ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhooks.tenants
    USING (nullif(current_setting('webhooks.tenant', true), '') IS NULL
           OR id = nullif(current_setting('webhooks.tenant', true), '')::bigint);

ALTER TABLE webhooks.webhook_health_metrics ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhooks.webhook_health_metrics
    USING (nullif(current_setting('webhooks.tenant', true), '') IS NULL
           OR webhook_id IN (SELECT e.id FROM webhooks.endpoints e
                             WHERE e.tenant_id = nullif(current_setting('webhooks.tenant', true), '')::bigint));

ALTER TABLE webhooks.endpoint_events ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhooks.endpoint_events
    USING (nullif(current_setting('webhooks.tenant', true), '') IS NULL
           OR webhook_id IN (SELECT e.id FROM webhooks.endpoints e
                             WHERE e.tenant_id = nullif(current_setting('webhooks.tenant', true), '')::bigint));

-- Bulk operations are started by admin tokens, which are never scoped: a scoped token sees none.
ALTER TABLE webhooks.api_operations ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhooks.api_operations
    USING (nullif(current_setting('webhooks.tenant', true), '') IS NULL);
