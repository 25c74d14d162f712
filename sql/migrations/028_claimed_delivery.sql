-- 028_claimed_delivery: the row a claim hands out, as a type.
--
-- webhooks.acquire() is a sequence of named steps (functions/claim.sql); two of them, the short
-- claim of one plain endpoint and the full claim, each return the claimed rows. Their columns are
-- written once, here, and acquire() returns the same type: the columns, their names and their order
-- are those acquire() returned before (RETURNS TABLE), so callers read it as they did.

CREATE TYPE webhooks.claimed_delivery AS (
    delivery_id      bigint,
    webhook_id       bigint,
    event_id         text,
    idempotency_key  text,
    event_type       text,
    payload          text,
    attempt          integer,
    max_attempts     integer,
    deferrals        integer,
    replays          integer,
    lease_token      uuid,
    locked_until     timestamptz,
    traceparent      text,
    endpoint_url     text,
    signing_secrets  jsonb,
    headers          jsonb,
    body_format      text,
    secret_settings  jsonb,
    timeout_ms       integer,     -- the endpoint's own timeout; NULL means the worker's default
    retry_schedule   jsonb,
    retry_jitter     real,
    created_at       timestamptz,
    retry_policy     jsonb,       -- delivery_config.retry_policy with the endpoint's keys on top
    digest_id        bigint,      -- the digest (one request) the row goes in; NULL: a request of its own
    tenant           text,        -- the row's tenant, by name
    tenant_rank      integer,     -- its place among the tenants by id (1: the first), at most 10001
    tenant_networks  cidr[]       -- the private networks granted to the tenant (tenants.allow_networks)
);
