-- 004_delivery_log: webhooks.alert_delivery_log, the append-only audit log.
--
-- One row per attempt and per state change. Partitioned by day so that retention drops whole
-- partitions instead of running a mass DELETE; a default partition catches anything outside the
-- partitions that webhooks.ensure_log_partitions() keeps ahead of time.

CREATE TABLE webhooks.alert_delivery_log (
    log_id           bigint      GENERATED ALWAYS AS IDENTITY,
    delivery_id      bigint      NOT NULL,
    webhook_id       bigint      NOT NULL,
    attempt          integer     NOT NULL,
    -- attempt outcomes: delivered, retry, deferred, dead_letter;
    -- state changes: lease_expired, released, replayed
    outcome          text        NOT NULL,
    failure_category text,
    http_status      integer,
    latency_ms       integer,
    error            text,
    response_excerpt text        CHECK (octet_length(response_excerpt) <= 1024),
    worker_id        text,
    lease_token      uuid,
    stale            boolean     NOT NULL DEFAULT false,
    logged_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (log_id, logged_at)
) PARTITION BY RANGE (logged_at);

CREATE TABLE webhooks.alert_delivery_log_default
    PARTITION OF webhooks.alert_delivery_log DEFAULT;

CREATE INDEX alert_delivery_log_delivery ON webhooks.alert_delivery_log (delivery_id, logged_at);

-- Creates the daily partitions from today up to `days_ahead` days ahead; idempotent. A day whose
-- rows already landed in the default partition is skipped (they stay readable there).
-- One creator at a time: every worker calls this, and when the day rolls over they all try to add
-- the same partition. Two creators would each read the default partition, then want it (and the
-- parent) exclusively: a lock-upgrade deadlock. A caller that finds another one busy returns 0;
-- its next round checks again.
CREATE FUNCTION webhooks.ensure_log_partitions(days_ahead integer DEFAULT 7) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    day date;
    part text;
    created integer := 0;
BEGIN
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
