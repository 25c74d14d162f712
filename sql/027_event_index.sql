-- 027_event_index: drop alert_delivery_queue_event, the queue's index on event_id (issue 7).
--
-- No function reads it, yet every row version pays for it: the insert, the claim and the finish
-- each add an entry (neither update is heap-only), at a random place in the tree since event ids
-- are random. Measured on one backend draining 50,000 rows through a bare claim, finish and audit
-- insert: 0.11-0.126 -> 0.093 ms of CPU per row; through acquire() and finish(): 0.156-0.167 ->
-- 0.145-0.150 ms.
--
-- The deliveries of one event are still one indexed lookup: publish() always, and enqueue() and
-- plain inserts without a key of their own, use the event id as the idempotency key, so
-- `SELECT * FROM webhooks.delivery_by_key('evt_…')` finds them. With no endpoint given, that
-- function now reaches the rows through the (webhook_id, idempotency_key) index, once per
-- endpoint, instead of reading the whole queue.

DROP INDEX webhooks.alert_delivery_queue_event;

CREATE OR REPLACE FUNCTION webhooks.delivery_by_key(p_idempotency_key text, p_webhook_id bigint DEFAULT NULL)
RETURNS SETOF webhooks.delivery_overview
LANGUAGE sql STABLE AS $$
    SELECT * FROM webhooks.delivery_overview
    WHERE idempotency_key = p_idempotency_key
      AND webhook_id = ANY (CASE WHEN p_webhook_id IS NULL THEN ARRAY(SELECT id FROM webhooks.endpoints)
                                 ELSE ARRAY[p_webhook_id] END)
    ORDER BY webhook_id;
$$;
