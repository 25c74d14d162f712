-- 011_wakeups: waking idle workers. One NOTIFY per INSERT statement on the queue (not per row),
-- switchable off in delivery_config for very high insert rates; and webhooks.next_due_in(), how
-- long an idle worker may sleep before a retry falls due or a lease expires.

CREATE FUNCTION webhooks.notify_workers() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT notify_enabled FROM webhooks.delivery_config) THEN
        -- PostgreSQL folds identical notifications within a transaction into one.
        PERFORM pg_notify('webhooks_queue', '');
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER notify_workers
    AFTER INSERT ON webhooks.alert_delivery_queue
    FOR EACH STATEMENT EXECUTE FUNCTION webhooks.notify_workers();

-- Serves next_due_in(): the claim index leads with priority, so it cannot give the earliest
-- due time cheaply.
CREATE INDEX alert_delivery_queue_next_due
    ON webhooks.alert_delivery_queue (next_retry_at)
    WHERE status IN ('pending', 'retrying');

-- Seconds until the next row becomes claimable (a retry falls due or a lease expires); 0 if one
-- already is; NULL when nothing is waiting.
CREATE FUNCTION webhooks.next_due_in() RETURNS double precision
LANGUAGE sql STABLE
SET jit = off
AS $$
    SELECT greatest(0, extract(epoch FROM least(
        (SELECT min(q.next_retry_at) FROM webhooks.alert_delivery_queue q
         WHERE q.status IN ('pending', 'retrying')
           AND EXISTS (SELECT 1 FROM webhooks.endpoints e WHERE e.id = q.webhook_id AND e.active)),
        (SELECT min(locked_until) FROM webhooks.alert_delivery_queue
         WHERE status = 'delivering')) - now()))::double precision;
$$;
