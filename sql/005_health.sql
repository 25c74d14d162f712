-- 005_health: webhooks.webhook_health_metrics, one row of counters and fleet-wide state per endpoint.
--
-- Written by webhooks.finish() once per endpoint per batch, always in endpoint-id order so that
-- concurrent batches never deadlock. The circuit, pause and rate columns are the fleet-wide state
-- that the claim reads; they live here so operators see health and state in one row.

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
    paused_until         timestamptz,
    in_flight            integer     NOT NULL DEFAULT 0,
    rate_tokens          double precision,
    rate_refilled_at     timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70);
