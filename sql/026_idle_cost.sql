-- 026_idle_cost: webhooks.next_due_in(), which an idle worker asks after every claim that came back
-- short, as in 012_wakeups but in PL/pgSQL with the ordering check written out (as 025 did for the
-- claim). As a SQL function it was planned afresh on every call, and called is_head_of_key() for
-- every waiting row: 2.2 ms a call, more than the claim itself, and the wait a new row sat through
-- before the next claim (bench/, latency at 200/s). Restated whole, with the SECURITY DEFINER and
-- search_path of 022_roles.
--
-- One result changes: with nothing waiting it now returns NULL, as 012 meant to. There,
-- greatest(0, NULL) is 0 (greatest() skips NULLs), so an idle worker with an empty queue slept the
-- 50 ms minimum instead of worker.poll_interval_seconds: some 20 claims a second per idle worker.

CREATE OR REPLACE FUNCTION webhooks.next_due_in() RETURNS double precision
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_at timestamptz;
BEGIN
    v_at := (
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
              AND (q.ordering_key IS NULL OR NOT EXISTS (
                  SELECT 1 FROM webhooks.alert_delivery_queue o
                  WHERE o.webhook_id = q.webhook_id AND o.ordering_key = q.ordering_key
                    AND o.delivery_id < q.delivery_id
                    AND o.status IN ('pending', 'retrying', 'delivering')))
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
    SELECT least(
        (SELECT min(at) FROM per_endpoint),
        (SELECT min(locked_until) FROM webhooks.alert_delivery_queue WHERE status = 'delivering')));
    IF v_at IS NULL THEN
        RETURN NULL;  -- nothing waits: sleep until NOTIFY or the polling interval
    END IF;
    RETURN greatest(0, extract(epoch FROM v_at - now()))::double precision;
END;
$$;
