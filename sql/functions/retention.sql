-- retention: removing what is no longer needed, in bounded batches.
--
-- Delivered rows leave after delivered_retention (7 days): the idempotency key stays unique for as
-- long as its row is kept. Audit log partitions wholly older than log_retention (30 days) are
-- dropped, not deleted from; rows of that age in the default partition are deleted in batches.
-- Dead letters stay until replayed or purged by an operator (webhooks.purge_dead_letters).
-- A message (webhooks.messages) goes with the last delivery row that points at it, however many
-- transactions delete its deliveries at once (release_messages()).
-- ensure_log_partitions() keeps the daily partitions of the audit log made ahead of time.
--
-- purge() is one batch in one short transaction; a worker calls it again while batches come back
-- full, within a time budget (worker/daemon/maintenance.py), so retention keeps pace with any delivery
-- rate. Any number of workers purge delivered rows at once, each skipping the rows another has
-- locked; the audit log is purged by one of them at a time (the others skip that part).

CREATE OR REPLACE FUNCTION webhooks.ensure_log_partitions(days_ahead integer DEFAULT 7) RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    day date;
    part text;
    created integer := 0;
BEGIN
    -- Bound: each partition is a table; a month ahead is more than any caller needs.
    IF days_ahead IS NULL OR days_ahead NOT BETWEEN 0 AND 31 THEN
        RAISE EXCEPTION 'ensure_log_partitions: days_ahead must be between 0 and 31, not %', days_ahead
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtext('webhooks.ensure_log_partitions')) THEN
        RETURN 0;
    END IF;
    FOR day IN
        SELECT d::date FROM generate_series(current_date, current_date + days_ahead, '1 day') d
    LOOP
        part := 'alert_delivery_log_' || to_char(day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass('webhooks.' || part) IS NOT NULL;
        CONTINUE WHEN EXISTS (
            SELECT 1 FROM webhooks.alert_delivery_log_default
            WHERE logged_at >= day AND logged_at < day + 1);
        BEGIN
            EXECUTE format(
                'CREATE TABLE webhooks.%I PARTITION OF webhooks.alert_delivery_log '
                'FOR VALUES FROM (%L) TO (%L)', part, day::timestamptz, (day + 1)::timestamptz);
            created := created + 1;
        EXCEPTION WHEN duplicate_table OR check_violation THEN
            NULL;  -- another worker made it first, or rows arrived in the default partition
        END;
    END LOOP;
    RETURN created;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.ensure_log_partitions(integer) TO webhooks_worker;

CREATE OR REPLACE FUNCTION webhooks.purge(p_batch_size integer DEFAULT 1000)
RETURNS TABLE (delivered_rows integer, log_partitions integer, log_rows integer)
LANGUAGE plpgsql
SET jit = off
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    cfg webhooks.delivery_config;
    v_partition record;
BEGIN
    -- Bound: a batch is one transaction, never a mass DELETE (NULL would be no LIMIT at all).
    IF p_batch_size IS NULL OR p_batch_size NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'purge: batch_size must be between 1 and 100000, not %', p_batch_size
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    delivered_rows := 0;
    log_partitions := 0;
    log_rows := 0;
    SELECT * INTO cfg FROM webhooks.delivery_config;

    -- Oldest first, through alert_delivery_queue_delivered; rows another worker's batch holds are
    -- skipped, not waited for.
    WITH doomed AS (
        SELECT q.delivery_id FROM webhooks.alert_delivery_queue q
        WHERE q.status = 'delivered' AND q.delivered_at < now() - cfg.delivered_retention
        ORDER BY q.delivered_at
        LIMIT p_batch_size
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM webhooks.alert_delivery_queue q USING doomed d WHERE q.delivery_id = d.delivery_id;
    GET DIAGNOSTICS delivered_rows = ROW_COUNT;

    IF NOT pg_try_advisory_xact_lock(hashtext('webhooks.purge')) THEN
        RETURN NEXT;  -- another worker is purging the audit log (and sweeping messages)
        RETURN;
    END IF;
    PERFORM webhooks.sweep_messages(p_batch_size * 10);
    -- A partition holds the rows of one day; it goes once the day's end is older than log_retention.
    FOR v_partition IN
        SELECT c.relname
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent
        JOIN pg_namespace n ON n.oid = p.relnamespace
        WHERE n.nspname = 'webhooks' AND p.relname = 'alert_delivery_log'
          AND c.relname ~ '^alert_delivery_log_[0-9]{8}$'
          AND to_date(right(c.relname, 8), 'YYYYMMDD') + 1 <= (now() - cfg.log_retention)::date
    LOOP
        EXECUTE format('DROP TABLE webhooks.%I', v_partition.relname);
        log_partitions := log_partitions + 1;
    END LOOP;

    WITH doomed AS (
        SELECT ctid FROM webhooks.alert_delivery_log_default
        WHERE logged_at < now() - cfg.log_retention
        LIMIT p_batch_size
    )
    DELETE FROM webhooks.alert_delivery_log_default l USING doomed d WHERE l.ctid = d.ctid;
    GET DIAGNOSTICS log_rows = ROW_COUNT;
    RETURN NEXT;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.purge(integer) TO webhooks_worker;

-- An operator's purge of dead letters (with their audit rows kept until log retention).
CREATE OR REPLACE FUNCTION webhooks.purge_dead_letters(
    p_older_than interval DEFAULT '0 seconds',
    p_webhook_id bigint   DEFAULT NULL,
    p_limit      integer  DEFAULT 10000
) RETURNS integer
LANGUAGE sql
SET jit = off
AS $$
    WITH doomed AS (
        SELECT q.delivery_id FROM webhooks.alert_delivery_queue q
        WHERE q.status = 'dead_letter' AND q.dead_lettered_at < now() - p_older_than
          AND (p_webhook_id IS NULL OR q.webhook_id = p_webhook_id)
        LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), deleted AS (
        DELETE FROM webhooks.alert_delivery_queue q USING doomed d
        WHERE q.delivery_id = d.delivery_id
        RETURNING 1
    )
    SELECT count(*)::integer FROM deleted;
$$;

-- Deleting delivery rows (retention, purge_dead_letters(), an operator's DELETE) deletes, once per
-- statement, the messages of those rows that no delivery points at any more. A message records the
-- range of delivery ids that point at it (the insert trigger, functions/enqueue.sql), so whether
-- any is left is read through the queue's primary key; the queue needs no index on message_id.
-- Nothing is counted, so nothing can be miscounted:
--   * A message one delivery pointed at goes with it: no one else deletes that delivery, and no
--     delivery is added to a message after the transaction that made it.
--   * The messages of several deliveries are locked, in id order (so deleting transactions never
--     deadlock), then looked at with a snapshot of this statement's own, taken once the locks are
--     held: two transactions deleting two deliveries of one message take turns, and the second sees
--     the first's delete committed and deletes the message. A message still pointed at by any
--     delivery (waiting, in flight, retrying, delivered or dead-lettered) stays.
-- A message without a range (made by the insert trigger of a release before migration 025, while
-- that migration ran) is kept. This holds under READ COMMITTED, which every function of ours and
-- an operator's psql session use; a REPEATABLE READ transaction does not see the other's commit.
CREATE OR REPLACE FUNCTION webhooks.release_messages() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    DELETE FROM webhooks.messages m
    USING deleted_rows o
    WHERE m.message_id = o.message_id
      AND m.first_delivery_id = o.delivery_id AND m.last_delivery_id = o.delivery_id;

    PERFORM FROM webhooks.messages m
    WHERE m.message_id IN (SELECT o.message_id FROM deleted_rows o)
    ORDER BY m.message_id
    FOR UPDATE;

    -- Each message's range read through the primary key, from its first id to the first delivery
    -- still there (a subquery per message, which the planner cannot turn into a scan of the queue).
    DELETE FROM webhooks.messages m
    WHERE m.message_id IN (SELECT o.message_id FROM deleted_rows o)
      AND m.first_delivery_id IS NOT NULL
      AND (SELECT q.delivery_id FROM webhooks.alert_delivery_queue q
           WHERE q.delivery_id BETWEEN m.first_delivery_id AND m.last_delivery_id
             AND q.message_id = m.message_id
           ORDER BY q.delivery_id LIMIT 1) IS NULL;
    RETURN NULL;
END;
$$;

-- The one message release_messages() never sees: made by an insert trigger for a row that ON
-- CONFLICT DO NOTHING then skipped, because a transaction not yet committed when the trigger ran had
-- inserted the same key. Each message is looked at once, after the transaction that made it has
-- ended (no delivery is added to it after that): those of at most p_limit messages past the sweep's
-- place without any delivery in their range are deleted. A message someone holds (a deletion looking
-- at it) is skipped: that one decides. It waits for every transaction that may still be making a
-- message at or below its bound: a few calls (housekeeping rounds) after a message was made. One
-- caller at a time (purge() calls it under its advisory lock). Returns the messages deleted.
CREATE OR REPLACE FUNCTION webhooks.sweep_messages(p_limit integer DEFAULT 10000) RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_sweep webhooks.message_sweep;
    v_through bigint;
    v_held bigint[];
    v_deleted integer := 0;
BEGIN
    SELECT * INTO v_sweep FROM webhooks.message_sweep FOR UPDATE;
    IF v_sweep.bound IS NULL THEN
        UPDATE webhooks.message_sweep
        SET bound = (SELECT s.last_value FROM webhooks.messages_message_id_seq s WHERE s.is_called);
        RETURN 0;
    END IF;
    IF v_sweep.bound_xmax IS NULL THEN
        -- taken a call later than the bound, so a transaction that drew an id at or below it had
        -- written its message (and so had a transaction id) by now
        UPDATE webhooks.message_sweep SET bound_xmax = pg_snapshot_xmax(pg_current_snapshot());
        RETURN 0;
    END IF;
    IF pg_snapshot_xmin(pg_current_snapshot()) < v_sweep.bound_xmax THEN
        RETURN 0;  -- a transaction that may be making such a message is still open
    END IF;
    v_through := least(v_sweep.bound, v_sweep.swept_through + p_limit);
    -- locked first, then looked at with a snapshot taken once they are held, as release_messages()
    -- does
    SELECT array_agg(l.message_id) INTO v_held
    FROM (SELECT m.message_id FROM webhooks.messages m
          WHERE m.message_id > v_sweep.swept_through AND m.message_id <= v_through
          ORDER BY m.message_id
          FOR UPDATE SKIP LOCKED) l;
    DELETE FROM webhooks.messages m
    WHERE m.message_id = ANY (v_held)
      AND m.first_delivery_id IS NOT NULL
      AND (SELECT q.delivery_id FROM webhooks.alert_delivery_queue q
           WHERE q.delivery_id BETWEEN m.first_delivery_id AND m.last_delivery_id
             AND q.message_id = m.message_id
           ORDER BY q.delivery_id LIMIT 1) IS NULL;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    UPDATE webhooks.message_sweep
    SET swept_through = v_through,
        bound = CASE WHEN v_through < v_sweep.bound THEN v_sweep.bound END,
        bound_xmax = CASE WHEN v_through < v_sweep.bound THEN v_sweep.bound_xmax END;
    RETURN v_deleted;
END;
$$;

CREATE OR REPLACE TRIGGER release_messages
    AFTER DELETE ON webhooks.alert_delivery_queue
    REFERENCING OLD TABLE AS deleted_rows
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks.release_messages();
