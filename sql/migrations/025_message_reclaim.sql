-- 025_message_reclaim: a message is reclaimed by looking for its deliveries, not by counting them.
--
-- A message counted the delivery rows that pointed at it (`deliveries`), and a statement trigger on
-- the queue's deletes lowered the count and deleted the message at zero. The count could not survive
-- concurrency: two transactions deleting two deliveries of one message at once (two workers' purges)
-- each lowered it under a predicate read before the other committed, so the second lowered nothing
-- and the message stayed with deliveries = 1 and no delivery, forever (23% of the messages of a
-- two-worker run); a delivery added while a purge removed the last one left the count one too
-- high; and the two purges' updates of the same messages, in no particular order, deadlocked.
--
-- From here on a message records the range of delivery ids that point at it (first_delivery_id,
-- last_delivery_id: the insert trigger sets and widens it), and only the transaction that made a
-- message adds deliveries to it. A statement that deletes delivery rows locks their messages in id
-- order and then, with a snapshot of its own, deletes those of them no delivery in the range points
-- at any more (functions/retention.sql): whoever deletes the last delivery sees the others gone.
-- The queue still has no index on message_id (every claim and finish would write it): the range is
-- read through the primary key.
--
-- One case escapes that: a row skipped by ON CONFLICT DO NOTHING because another transaction, not yet
-- committed when this row's insert trigger ran, inserted the same key (two publishes of one key at
-- once). Its trigger made a message no row ever points at. webhooks.sweep_messages() (run by purge())
-- looks once at every message whose making transaction has ended, and deletes those without a
-- delivery; message_sweep is where it is.
--
-- The messages already stored get their ranges from the queue, and those no delivery points at
-- (left by the count) are deleted here. Every message row is rewritten once (VACUUM the table
-- afterwards if it is large). `deliveries` is no longer read or written by the definitions; it is
-- kept because the insert trigger of the release before this one, which runs until this release's
-- definitions replace it a moment after this migration, still adds to it. A message that trigger
-- makes in that moment has no range and is never reclaimed (it is kept, not lost).

-- No message is made, added to or deleted while the ranges are filled (producers wait; the queue's
-- claims and finishes, which only read messages, do not).
LOCK TABLE webhooks.messages IN SHARE ROW EXCLUSIVE MODE;

ALTER TABLE webhooks.messages
    ADD COLUMN first_delivery_id bigint,
    ADD COLUMN last_delivery_id  bigint,
    ADD CONSTRAINT delivery_range_ordered CHECK (first_delivery_id <= last_delivery_id);

COMMENT ON COLUMN webhooks.messages.deliveries IS
    'Unused: the count of deliveries the releases before 020 kept. Kept for their insert trigger.';
COMMENT ON COLUMN webhooks.messages.first_delivery_id IS
    'The lowest delivery id that points at this message (NULL: made without one, never reclaimed).';
COMMENT ON COLUMN webhooks.messages.last_delivery_id IS
    'The highest delivery id that points at this message.';

UPDATE webhooks.messages m
SET first_delivery_id = r.first_id, last_delivery_id = r.last_id
FROM (SELECT q.message_id, min(q.delivery_id) AS first_id, max(q.delivery_id) AS last_id
      FROM webhooks.alert_delivery_queue q
      WHERE q.message_id IS NOT NULL
      GROUP BY q.message_id) r
WHERE m.message_id = r.message_id;

DO $$
DECLARE
    v_orphans integer;
BEGIN
    DELETE FROM webhooks.messages m WHERE m.first_delivery_id IS NULL;
    GET DIAGNOSTICS v_orphans = ROW_COUNT;
    IF v_orphans > 0 THEN
        RAISE NOTICE 'deleted % message(s) no delivery pointed at (left by concurrent purges)', v_orphans;
    END IF;
END;
$$;

-- The sweep: every message up to swept_through has been looked at. `bound` is the highest message id
-- made when it was read, `bound_xmax` the next transaction id a little later: once every
-- transaction older than that has ended, nothing can still add a message at or below `bound`.
CREATE TABLE webhooks.message_sweep (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    swept_through bigint  NOT NULL,
    bound         bigint,
    bound_xmax    xid8
);
-- the messages there are now were looked at above
INSERT INTO webhooks.message_sweep (swept_through)
SELECT coalesce((SELECT max(m.message_id) FROM webhooks.messages m), 0);
