-- stats: queue statistics for metrics and people, computed by one worker at a time.
--
-- webhooks.queue_stats() counts only for the first caller in each interval (stats_sample records
-- when the fleet last sampled), so with N workers offering every 15 s the database counts about
-- once per 15 s, not N times; the others get NULL and keep their last sample. Aggregate the
-- sampled gauges across pods with max(). webhooks.queue_statistics is the same numbers, for psql;
-- webhooks.held_back, the claimable rows a claim leaves in the table on purpose, and why.

CREATE OR REPLACE VIEW webhooks.queue_statistics AS
SELECT s.status, coalesce(c.deliveries, 0) AS deliveries, c.oldest_due_age_seconds
FROM unnest(ARRAY['pending', 'delivering', 'retrying', 'delivered', 'dead_letter']) AS s(status)
LEFT JOIN (
    SELECT q.status, count(*) AS deliveries,
           extract(epoch FROM now() - min(q.next_retry_at) FILTER (
               WHERE q.status IN ('pending', 'retrying') AND q.next_retry_at <= now()))::double precision
               AS oldest_due_age_seconds
    FROM webhooks.alert_delivery_queue q
    -- a view runs as its owner, whom row-level security does not bind: it applies the tenant itself
    WHERE (SELECT webhooks.caller_tenant()) IS NULL OR q.tenant_id = (SELECT webhooks.caller_tenant())
    GROUP BY q.status
) c ON c.status = s.status;
GRANT SELECT ON webhooks.queue_statistics TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;

-- Due rows held back, and why: what the claim leaves in the table on purpose.
CREATE OR REPLACE VIEW webhooks.held_back AS
SELECT CASE WHEN NOT e.active THEN 'endpoint_disabled'
            WHEN h.paused_until > now() THEN 'paused'
            WHEN h.circuit_state = 'forced_open'
              OR (h.circuit_state = 'open' AND h.circuit_open_until > now()) THEN 'circuit_open'
            WHEN coalesce(e.rate_limit_per_second, c.rate_limit_per_second) IS NOT NULL
              AND coalesce(h.rate_tokens, 1) < 1 THEN 'rate_limited'
            WHEN (SELECT count(*) FROM webhooks.alert_delivery_queue d
                  WHERE d.webhook_id = e.id AND d.status = 'delivering' AND d.locked_until > now())
                 >= coalesce(e.max_in_flight, c.max_in_flight) THEN 'concurrency_cap'
            -- the tenant's limits, across all its endpoints (acquire() in claim.sql)
            WHEN t.rate_limit_per_second IS NOT NULL AND coalesce(t.rate_tokens, 1) < 1 THEN 'tenant_rate_limited'
            WHEN t.max_in_flight IS NOT NULL
              AND (SELECT count(DISTINCT coalesce(d.digest_id, -d.delivery_id))
                   FROM webhooks.alert_delivery_queue d
                   WHERE d.tenant_id = t.id AND d.status = 'delivering' AND d.locked_until > now())
                  >= t.max_in_flight THEN 'tenant_concurrency_cap'
            -- worker pools per tenant: live workers have pools, and none of them serves this tenant
            WHEN EXISTS (SELECT 1 FROM webhooks.worker_liveness w
                         WHERE w.lost_at IS NULL AND (w.tenants IS NOT NULL OR w.exclude_tenants IS NOT NULL))
              AND NOT EXISTS (SELECT 1 FROM webhooks.worker_liveness w
                              WHERE w.lost_at IS NULL
                                AND (w.tenants IS NULL OR t.name = ANY (w.tenants))
                                AND (w.exclude_tenants IS NULL OR NOT t.name = ANY (w.exclude_tenants)))
              THEN 'no_pool'
       END AS reason,
       e.id AS webhook_id, due.rows
FROM webhooks.endpoints e
JOIN webhooks.webhook_health_metrics h ON h.webhook_id = e.id
JOIN webhooks.tenants t ON t.id = e.tenant_id
CROSS JOIN webhooks.delivery_config c
CROSS JOIN LATERAL (
    SELECT count(*) AS rows FROM webhooks.claimable q
    WHERE q.webhook_id = e.id AND q.next_retry_at <= now()
) due
WHERE due.rows > 0
  -- a view runs as its owner, whom row-level security does not bind: it applies the tenant itself
  AND ((SELECT webhooks.caller_tenant()) IS NULL OR e.tenant_id = (SELECT webhooks.caller_tenant()));
GRANT SELECT ON webhooks.held_back TO webhooks_reader, webhooks_admin, webhooks_tenant_admin;

CREATE OR REPLACE FUNCTION webhooks.queue_stats(p_endpoint_limit integer DEFAULT 100,
                                                p_interval interval DEFAULT '10 seconds') RETURNS jsonb
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_depth jsonb;
    v_oldest_due_age double precision;
BEGIN
    UPDATE webhooks.stats_sample SET sampled_at = now()
    WHERE sampled_at <= now() - p_interval
      AND pg_try_advisory_xact_lock(hashtext('webhooks.queue_stats'));
    IF NOT FOUND THEN
        RETURN NULL;  -- another worker sampled within the interval, or is sampling now
    END IF;
    SELECT jsonb_object_agg(s.status, s.deliveries), max(s.oldest_due_age_seconds)
    INTO v_depth, v_oldest_due_age
    FROM webhooks.queue_statistics s;
    RETURN jsonb_build_object(
        'depth', v_depth,
        'oldest_due_age_seconds', v_oldest_due_age,
        'held_back', (SELECT coalesce(jsonb_object_agg(reason, rows), '{}') FROM (
            SELECT reason, sum(rows) AS rows FROM webhooks.held_back
            WHERE reason IS NOT NULL GROUP BY reason) r),
        'circuits', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'endpoint', e.name, 'state', h.circuit_state) ORDER BY e.id), '[]')
            FROM (SELECT * FROM webhooks.endpoints ORDER BY id LIMIT p_endpoint_limit) e
            JOIN webhooks.webhook_health_metrics h ON h.webhook_id = e.id),
        -- rows by tenant and status: the first p_endpoint_limit tenants by id by name, the rest
        -- together as 'other', so the number of series stays bounded as the endpoint label's does
        'tenants', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'tenant', x.label, 'status', x.status, 'deliveries', x.n) ORDER BY x.label, x.status), '[]')
            FROM (SELECT coalesce(named.name, 'other') AS label, q.status, count(*) AS n
                  FROM webhooks.alert_delivery_queue q
                  LEFT JOIN (SELECT t.id, t.name FROM webhooks.tenants t ORDER BY t.id LIMIT p_endpoint_limit)
                      named ON named.id = q.tenant_id
                  GROUP BY 1, 2) x)
    );
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.queue_stats(integer, interval) TO webhooks_worker;
