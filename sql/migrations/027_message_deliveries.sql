-- 027_message_deliveries: a page of messages finds its deliveries through an index, not by reading
-- the queue.
--
-- GET /v1/messages lists messages newest first, each with its deliveries; the queue had no index on
-- message_id (an entry in it would be written by every claim and every finish, the writes that
-- messages were split off to make smaller), so the deliveries of a page were found by reading the
-- whole queue: 3.2-3.6 s for a page of 1,000 messages with 1,000,000 stored.
--
-- This index leaves out the rows in flight: a claim makes a row `delivering`, which it does not
-- match, so a claim writes no entry in it; the insert and each finish do. The rows in flight are
-- found through the small index of leased rows (alert_delivery_queue_leased, at most the fleet's
-- concurrency), and webhooks.message_deliveries reads both (functions/messages.sql).
--
-- On a large queue, build it beforehand without blocking writers, and this migration finds it:
--   CREATE INDEX CONCURRENTLY alert_delivery_queue_message ON webhooks.alert_delivery_queue
--       (message_id) WHERE status <> 'delivering';

CREATE INDEX IF NOT EXISTS alert_delivery_queue_message
    ON webhooks.alert_delivery_queue (message_id)
    WHERE status <> 'delivering';
