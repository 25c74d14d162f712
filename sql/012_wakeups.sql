-- 012_wakeups: waking idle workers. One NOTIFY per INSERT statement on the queue (not per row),
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

-- Seconds until the next row may be claimable: a retry falls due, a rate-limited endpoint earns
-- a token, a pause or an open circuit's sleep ends, or a lease expires; 0 if one already is; NULL
-- when nothing waits. Only rows that could be sent count (active endpoints, heads of their
-- ordering key), so an idle worker does not spin on rows that are held back.
CREATE FUNCTION webhooks.next_due_in() RETURNS double precision
LANGUAGE sql STABLE
SET jit = off
AS $$
    WITH cfg AS (
        SELECT * FROM webhooks.delivery_config
    ), per_endpoint AS (
        SELECT greatest(
                   due.at,
                   h.paused_until,
                   CASE WHEN h.circuit_state = 'open' THEN h.circuit_open_until END,
                   CASE WHEN r.rate IS NOT NULL AND coalesce(h.rate_tokens, 1) < 1
                        THEN h.rate_refilled_at + make_interval(secs => (1 - h.rate_tokens) / r.rate) END
               ) AS at
        FROM webhooks.webhook_health_metrics h
        JOIN webhooks.endpoints e ON e.id = h.webhook_id
        CROSS JOIN cfg
        CROSS JOIN LATERAL (SELECT coalesce(e.rate_limit_per_second, cfg.rate_limit_per_second)::double precision
                            AS rate) r
        CROSS JOIN LATERAL (
            SELECT min(q.next_retry_at) AS at
            FROM webhooks.alert_delivery_queue q
            WHERE q.webhook_id = h.webhook_id AND q.status IN ('pending', 'retrying')
              AND webhooks.is_head_of_key(q.webhook_id, q.ordering_key, q.delivery_id)
        ) due
        CROSS JOIN LATERAL (
            SELECT count(*) AS flying FROM webhooks.alert_delivery_queue d
            WHERE d.webhook_id = h.webhook_id AND d.status = 'delivering' AND d.locked_until > now()
        ) f
        WHERE e.active AND h.circuit_state <> 'forced_open' AND due.at IS NOT NULL
          -- an endpoint at its cap (or out of probes) is woken by the finish that frees a place
          AND f.flying < coalesce(e.max_in_flight, cfg.max_in_flight)
          AND NOT (h.circuit_state = 'half_open' AND f.flying + h.probe_successes + h.probe_failures
                   >= coalesce((e.circuit_policy ->> 'probes')::integer, cfg.circuit_probes))
    )
    SELECT greatest(0, extract(epoch FROM least(
        (SELECT min(at) FROM per_endpoint),
        (SELECT min(locked_until) FROM webhooks.alert_delivery_queue WHERE status = 'delivering')
    ) - now()))::double precision;
$$;
