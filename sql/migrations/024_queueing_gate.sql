-- 024_queueing_gate: what the one gate for queueing takes, and the test events' rate.
--
-- Every function that queues a delivery hands its requests to webhooks.queue_deliveries()
-- (functions/enqueue.sql), which applies the tenant, quota, disabled-endpoint and bound rules once.
-- It takes a set of requests, so that a caller with many (a batch, a statement-level trigger with
-- a transition table) makes one set-based call:
--   SELECT * FROM webhooks.queue_deliveries(ARRAY(SELECT ROW(…)::webhooks.delivery_request FROM …), 'producer');
-- A type, not a table: nothing is stored in this shape.
CREATE TYPE webhooks.delivery_request AS (
    ordinal            integer,     -- its place among the call's requests: answered back with each row
    webhook_id         bigint,      -- the endpoint addressed; NULL: every subscriber of event_type
    event_type         text,
    event_id           text,        -- NULL: a new one ('evt_' and 32 hex digits)
    idempotency_key    text,        -- NULL: the event id
    payload            jsonb,
    metadata           jsonb,       -- NULL: '{}'
    source_ref         text,
    priority           integer,     -- NULL: 0
    ordering_key       text,
    max_attempts       integer,
    deliver_at         timestamptz, -- NULL: now
    traceparent        text,
    expires_at         timestamptz,
    -- a fan-out's audience, for the worker's own events: this tenant's subscribers (and those
    -- marked operational_all_tenants); for every other caller the audience is the caller's tenant
    tenant_id          bigint,
    exclude_webhook_id bigint       -- a fan-out never to this endpoint (an event's own subject)
);

-- When each endpoint's recent test events were sent, the last minute's (older ones are dropped on
-- the next send): the gate refuses an eleventh within a minute, for every API process and console
-- alike. A row per endpoint that was ever sent one; it goes with its endpoint.
CREATE TABLE webhooks.test_event_sends (
    webhook_id bigint PRIMARY KEY REFERENCES webhooks.endpoints (id) ON DELETE CASCADE,
    sent_at    timestamptz[] NOT NULL
);
