-- 009_delivered_index: the delivered rows in the order retention removes them. Without it each
-- batch of webhooks.purge() scanned the queue table from its start for delivered rows past
-- delivered_retention: with a week of delivered rows kept, up to the whole table for every batch
-- (once VACUUM has let new rows reuse the space, the eligible ones can lie anywhere in it), and
-- before VACUUM, the dead rows earlier batches left as well. A finish to
-- `delivered` already writes new index entries (`status` is in the partial indexes' predicates, so
-- the update is never heap-only); this adds one more, of a timestamp.
--
-- Built in the migration's transaction: writes to the queue wait while it is built. On a large
-- table, build it beforehand with
--   CREATE INDEX CONCURRENTLY alert_delivery_queue_delivered ON webhooks.alert_delivery_queue
--       (delivered_at) WHERE status = 'delivered';
-- and the migration finds it there.

CREATE INDEX IF NOT EXISTS alert_delivery_queue_delivered
    ON webhooks.alert_delivery_queue (delivered_at)
    WHERE status = 'delivered';
