-- messages: what was published, once per event and tenant (webhooks.messages, migrations/014), and
-- the deliveries it fanned out to, for GET /v1/messages. A message made by a plain INSERT into the
-- queue is listed as one made by webhooks.publish() or the API is: the queue's insert trigger makes
-- both (fill_idempotency_key(), functions/enqueue.sql).
--
-- Both views run as their owner, whom row-level security does not bind, and apply the caller's
-- tenant themselves (caller_tenant(), functions/access.sql), as webhooks.deliveries does; a tenant
-- administrator, who may not read the messages table, reads them here, kept to its tenant.

CREATE OR REPLACE VIEW webhooks.message_overview AS
SELECT m.message_id, m.event_id, m.event_type, m.created_at, m.traceparent, m.source_ref, m.metadata,
       m.payload, m.tenant_id
FROM webhooks.messages m
WHERE (SELECT webhooks.caller_tenant()) IS NULL OR m.tenant_id = (SELECT webhooks.caller_tenant());
GRANT SELECT ON webhooks.message_overview TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;

-- Each delivery of a message: its endpoint (a deleted one's finished rows stay under its id and name)
-- and its state. A message's deliveries are found through alert_delivery_queue_message (every row but
-- those in flight, migrations/020: a claim writes no entry in it) and, for the rows in flight,
-- through the small index of leased rows: hence the two branches. Ask for the deliveries of a page
-- of messages together (message_id = ANY (…)): both branches take the condition. The fleet's
-- max_attempts is a scalar subquery, not a join: joined, the one-row delivery_config (never
-- analyzed) counted as 320 rows, and a page of 1,000 deliveries was costed past jit_above_cost,
-- spending 100 ms compiling a plan that ran in 2.
CREATE OR REPLACE VIEW webhooks.message_deliveries AS
SELECT q.message_id, q.delivery_id, q.webhook_id AS endpoint_id, coalesce(e.name, d.name) AS endpoint_name,
       q.idempotency_key, q.status, q.attempts,
       coalesce(q.max_attempts, e.max_attempts, (SELECT c.max_attempts FROM webhooks.delivery_config c))
           AS max_attempts, q.replays,
       q.next_retry_at, q.last_http_status, q.failure_category, q.dead_letter_reason, q.delivered_at,
       q.dead_lettered_at, d.deleted_at AS endpoint_deleted_at
FROM (
    SELECT * FROM webhooks.alert_delivery_queue w WHERE w.status <> 'delivering'
    UNION ALL
    SELECT * FROM webhooks.alert_delivery_queue f WHERE f.status = 'delivering'
) q
LEFT JOIN webhooks.endpoints e ON e.id = q.webhook_id
LEFT JOIN webhooks.deleted_endpoints d ON d.id = q.webhook_id
WHERE q.message_id IS NOT NULL
  AND ((SELECT webhooks.caller_tenant()) IS NULL OR q.tenant_id = (SELECT webhooks.caller_tenant()));
GRANT SELECT ON webhooks.message_deliveries TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;
