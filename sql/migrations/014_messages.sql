-- 014_messages: what was published is stored once, as a message; a delivery row keeps the state.
--
-- A delivery row used to carry its payload (and metadata, source_ref), so the claim and the finish,
-- which rewrite the whole row, copied about 1 KB twice per delivery, and an event fanned out to five
-- endpoints was stored five times. From here on webhooks.messages holds what a producer published
-- (event id and type, payload, metadata, source_ref, trace context) once per event and tenant, and
-- each delivery row points at it (message_id) and keeps only the delivery's state. Producers insert
-- into alert_delivery_queue as before, with the same columns and ON CONFLICT: the queue's insert
-- trigger (fill_idempotency_key(), functions/enqueue.sql) moves the payload, metadata and source_ref
-- into a message (the same one for every delivery of one event) and leaves those columns NULL in
-- the delivery row. The view webhooks.deliveries shows every delivery with its message's fields,
-- as the queue's rows read before.
--
-- `deliveries` counts the delivery rows that point at a message: the insert trigger adds one, and
-- deleting delivery rows (retention, purging dead letters) takes them off and deletes the messages
-- no delivery needs any more (functions/retention.sql). No index on the queue's message_id: it
-- would add an entry to every claim and finish, the writes this change makes smaller.
--
-- The rows already queued are moved here: one message per (tenant, event id, event type, payload,
-- metadata, source_ref, trace context), with as many deliveries as rows point at it. Nothing is
-- resent or lost: only where the payload is stored changes; a row's status, lease and attempts stay
-- as they were. The queue's rows are each rewritten once (VACUUM the table afterwards on a large
-- queue).

CREATE TABLE webhooks.messages (
    message_id  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- how many delivery rows point here (kept by the queue's triggers)
    deliveries  integer     NOT NULL DEFAULT 1 CHECK (deliveries >= 0),
    tenant_id   bigint      NOT NULL DEFAULT 1,
    event_id    text        NOT NULL,
    event_type  text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    traceparent text,
    source_ref  text,
    metadata    jsonb       NOT NULL DEFAULT '{}',
    -- last: a change of the counter above is logged without the payload (an update's WAL record
    -- leaves out the bytes the old and new row share at both ends)
    payload     jsonb       NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0.05,
    autovacuum_vacuum_insert_scale_factor = 0.05
);

COMMENT ON TABLE webhooks.messages IS
    'What producers published, once per event and tenant; each delivery row points at its message.';

-- The insert trigger finds the message an event's earlier deliveries made (fan-out) here.
CREATE INDEX messages_event ON webhooks.messages (tenant_id, event_id);

-- Fillfactor 50 (was 70): a claim and a finish each write a new version of the row, and one that
-- fits on the row's own page is logged as the bytes that changed, without a lock record; on a
-- full page it is logged whole. Measured on a 1 KB-payload drain: 1,393 → 1,292 WAL bytes per
-- delivery. The rows are small now, so the room costs little. (New pages only: no rewrite here.)
ALTER TABLE webhooks.alert_delivery_queue
    ADD COLUMN message_id bigint,
    ALTER COLUMN payload DROP NOT NULL,
    ALTER COLUMN metadata DROP NOT NULL,
    SET (fillfactor = 50);

-- The rows already queued.
CREATE TEMPORARY TABLE moved_messages ON COMMIT DROP AS
SELECT nextval(pg_get_serial_sequence('webhooks.messages', 'message_id')) AS message_id, g.*
FROM (SELECT q.tenant_id, q.event_id, q.event_type, q.traceparent, q.source_ref, q.metadata, q.payload,
             min(q.created_at) AS created_at, count(*)::integer AS deliveries
      FROM webhooks.alert_delivery_queue q
      WHERE q.message_id IS NULL AND q.payload IS NOT NULL
      GROUP BY q.tenant_id, q.event_id, q.event_type, q.traceparent, q.source_ref, q.metadata, q.payload) g;

INSERT INTO webhooks.messages
    (message_id, deliveries, tenant_id, event_id, event_type, created_at, traceparent, source_ref, metadata,
     payload)
OVERRIDING SYSTEM VALUE
SELECT message_id, deliveries, tenant_id, event_id, event_type, created_at, traceparent, source_ref,
       coalesce(metadata, '{}'), payload
FROM moved_messages;

UPDATE webhooks.alert_delivery_queue q
SET message_id = m.message_id, payload = NULL, metadata = NULL, source_ref = NULL
FROM moved_messages m
WHERE q.message_id IS NULL AND q.payload IS NOT NULL
  AND m.tenant_id = q.tenant_id AND m.event_id = q.event_id AND m.event_type = q.event_type
  AND m.traceparent IS NOT DISTINCT FROM q.traceparent AND m.source_ref IS NOT DISTINCT FROM q.source_ref
  AND m.metadata IS NOT DISTINCT FROM q.metadata AND m.payload = q.payload;

-- Isolation as on the queue: with webhooks.tenant set, a role other than the owner reads only that
-- tenant's messages.
ALTER TABLE webhooks.messages ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON webhooks.messages
    USING (nullif(current_setting('webhooks.tenant', true), '') IS NULL
           OR tenant_id = nullif(current_setting('webhooks.tenant', true), '')::bigint);

-- The claim's line of endpoints, per tenant. acquire() takes each tenant's least recently served
-- endpoints that have due rows; it used to rank every endpoint (and ask each whether it had a due
-- row) on every claim, 94 ms per claim over 10,000 endpoints. With the tenant on the state row and
-- this index it walks each tenant's endpoints in that order and stops when it has enough. The
-- tenant is kept equal to the endpoint's by the endpoints' trigger (functions/endpoints.sql).
ALTER TABLE webhooks.webhook_health_metrics ADD COLUMN tenant_id bigint NOT NULL DEFAULT 1;
UPDATE webhooks.webhook_health_metrics h SET tenant_id = e.tenant_id
FROM webhooks.endpoints e
WHERE e.id = h.webhook_id AND h.tenant_id IS DISTINCT FROM e.tenant_id;
CREATE INDEX webhook_health_metrics_claim_order
    ON webhooks.webhook_health_metrics (tenant_id, last_claimed_at NULLS FIRST, webhook_id);
