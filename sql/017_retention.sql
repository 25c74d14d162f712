-- 017_retention: removing what is no longer needed, in bounded batches, one worker at a time.
--
-- Delivered rows leave after delivered_retention (7 days): the idempotency key stays unique for as
-- long as its row is kept. Audit log partitions wholly older than log_retention (30 days) are
-- dropped, not deleted from; rows of that age in the default partition are deleted in batches.
-- Dead letters stay until replayed or purged by an operator (webhooks.purge_dead_letters).

CREATE FUNCTION webhooks.purge(p_batch_size integer DEFAULT 1000)
RETURNS TABLE (delivered_rows integer, log_partitions integer, log_rows integer)
LANGUAGE plpgsql
SET jit = off
AS $$
DECLARE
    cfg webhooks.delivery_config;
    v_partition record;
BEGIN
    delivered_rows := 0;
    log_partitions := 0;
    log_rows := 0;
    IF NOT pg_try_advisory_xact_lock(hashtext('webhooks.purge')) THEN
        RETURN NEXT;  -- another worker is purging
        RETURN;
    END IF;
    SELECT * INTO cfg FROM webhooks.delivery_config;

    WITH doomed AS (
        SELECT q.delivery_id FROM webhooks.alert_delivery_queue q
        WHERE q.status = 'delivered' AND q.delivered_at < now() - cfg.delivered_retention
        LIMIT p_batch_size
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM webhooks.alert_delivery_queue q USING doomed d WHERE q.delivery_id = d.delivery_id;
    GET DIAGNOSTICS delivered_rows = ROW_COUNT;

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

-- An operator's purge of dead letters (with their audit rows kept until log retention).
CREATE FUNCTION webhooks.purge_dead_letters(
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
