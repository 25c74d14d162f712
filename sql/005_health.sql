-- 005_health: webhooks.webhook_health_metrics, one row of counters and fleet-wide state per endpoint.
--
-- Written by webhooks.finish() once per endpoint per batch, always in endpoint-id order so that
-- concurrent batches never deadlock. The circuit, pause and rate columns are the fleet-wide state
-- that the claim reads and updates under this row's lock; they live here so operators see health
-- and state in one row. Every endpoint has a row from its registration on.

CREATE TABLE webhooks.webhook_health_metrics (
    webhook_id           bigint      PRIMARY KEY REFERENCES webhooks.endpoints (id) ON DELETE CASCADE,
    total_attempts       bigint      NOT NULL DEFAULT 0,
    successes            bigint      NOT NULL DEFAULT 0,
    failures             bigint      NOT NULL DEFAULT 0,
    consecutive_failures integer     NOT NULL DEFAULT 0,
    total_latency_ms     bigint      NOT NULL DEFAULT 0,
    avg_latency_ms       double precision GENERATED ALWAYS AS
        (CASE WHEN total_attempts > 0 THEN total_latency_ms::double precision / total_attempts END) STORED,
    last_success_at      timestamptz,
    last_failure_at      timestamptz,
    last_http_status     integer,
    last_failure_category text,
    health_status        text        NOT NULL DEFAULT 'unknown'
        CHECK (health_status IN ('unknown', 'healthy', 'degraded', 'failing', 'disabled')),
    circuit_state        text        NOT NULL DEFAULT 'closed'
        CHECK (circuit_state IN ('closed', 'open', 'half_open', 'forced_open', 'forced_closed')),
    circuit_opened_at    timestamptz,
    circuit_open_until   timestamptz,
    circuit_sleep_seconds integer,
    -- half-open: the outcomes of probes so far (probes not yet answered are the rows in flight)
    probe_successes      integer     NOT NULL DEFAULT 0,
    probe_failures       integer     NOT NULL DEFAULT 0,
    -- The circuit's sliding window, as two fixed windows weighted by overlap: cheap to keep per
    -- batch and close enough to a true sliding count.
    window_started_at    timestamptz,
    window_attempts      integer     NOT NULL DEFAULT 0,
    window_failures      integer     NOT NULL DEFAULT 0,
    previous_attempts    integer     NOT NULL DEFAULT 0,
    previous_failures    integer     NOT NULL DEFAULT 0,
    -- 429/503 with Retry-After pauses the whole endpoint, for every worker.
    paused_until         timestamptz,
    rate_tokens          double precision,
    rate_refilled_at     timestamptz,
    failing_since        timestamptz,
    dead_letters_since_notice integer NOT NULL DEFAULT 0,
    -- the claim serves the least recently served endpoints first
    last_claimed_at      timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);

-- Every endpoint has its state row from the start, however it was inserted: the claim locks it.
CREATE FUNCTION webhooks.create_health_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhooks.webhook_health_metrics (webhook_id) VALUES (NEW.id)
    ON CONFLICT (webhook_id) DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER create_health_row
    AFTER INSERT ON webhooks.endpoints
    FOR EACH ROW EXECUTE FUNCTION webhooks.create_health_row();
