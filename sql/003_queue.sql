-- 003_queue: webhooks.alert_delivery_queue, one row per (event, endpoint) delivery.
--
-- `INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload) VALUES (...)` is
-- enough to enqueue: every other column has a default, and the idempotency key defaults to the
-- event id (set by a BEFORE trigger, since a column default cannot read another column).
--
-- Hot-table care: fillfactor below 100 so status updates stay heap-only, partial indexes that cover
-- only the claimable and leased rows, and autovacuum tuned for a table whose rows churn.

CREATE TABLE webhooks.alert_delivery_queue (
    delivery_id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id         bigint      NOT NULL REFERENCES webhooks.endpoints (id),
    event_id           text        NOT NULL DEFAULT 'evt_' || replace(gen_random_uuid()::text, '-', ''),
    idempotency_key    text        NOT NULL,
    event_type         text        NOT NULL CHECK (event_type <> ''),
    payload            jsonb       NOT NULL,
    source_ref         text,
    metadata           jsonb       NOT NULL DEFAULT '{}',
    status             text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'delivering', 'retrying', 'delivered', 'dead_letter')),
    priority           smallint    NOT NULL DEFAULT 0,
    ordering_key       text,
    attempts           integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    deferrals          integer     NOT NULL DEFAULT 0 CHECK (deferrals >= 0),
    replays            integer     NOT NULL DEFAULT 0 CHECK (replays >= 0),
    -- NULL: the endpoint's override, else webhooks.delivery_config.max_attempts
    max_attempts       integer     CHECK (max_attempts BETWEEN 1 AND 100),
    next_retry_at      timestamptz NOT NULL DEFAULT now(),
    locked_by          text,
    lease_token        uuid,
    locked_until       timestamptz,
    last_http_status   integer,
    last_error         text,
    failure_category   text,
    dead_letter_reason text,
    traceparent        text,
    expires_at         timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now(),
    -- When the current round of attempts began (insert or replay): the retry window of a row whose
    -- endpoint is disabled is measured from here.
    scheduled_at       timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    delivered_at       timestamptz,
    dead_lettered_at   timestamptz,
    CONSTRAINT lease_columns_together
        CHECK ((status = 'delivering') = (lease_token IS NOT NULL AND locked_until IS NOT NULL))
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02
);

-- The key is unique per endpoint for as long as the row is kept: producers that may retry insert
-- with ON CONFLICT (webhook_id, idempotency_key) DO NOTHING.
CREATE UNIQUE INDEX alert_delivery_queue_idempotency
    ON webhooks.alert_delivery_queue (webhook_id, idempotency_key);

-- The claim walks this per endpoint, in this order; it only ever holds rows waiting to be sent.
CREATE INDEX alert_delivery_queue_claimable
    ON webhooks.alert_delivery_queue (webhook_id, priority DESC, next_retry_at, delivery_id)
    WHERE status IN ('pending', 'retrying');

-- Is anything of this endpoint due, and when is its next row due? Without this, both would scan
-- every waiting row of an endpoint whose backlog is scheduled for later.
CREATE INDEX alert_delivery_queue_due
    ON webhooks.alert_delivery_queue (webhook_id, next_retry_at)
    WHERE status IN ('pending', 'retrying');

-- Rows in flight: per-endpoint concurrency is counted here, expired leases are found here. It
-- is small by nature (at most the fleet's concurrency).
CREATE INDEX alert_delivery_queue_leased
    ON webhooks.alert_delivery_queue (webhook_id, locked_until)
    WHERE status = 'delivering';

-- Opt-in ordering: a row with an ordering key waits for earlier unfinished rows of its key.
CREATE INDEX alert_delivery_queue_ordering
    ON webhooks.alert_delivery_queue (webhook_id, ordering_key, delivery_id)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'retrying', 'delivering');

CREATE INDEX alert_delivery_queue_event ON webhooks.alert_delivery_queue (event_id);
CREATE INDEX alert_delivery_queue_dead_letters
    ON webhooks.alert_delivery_queue (webhook_id, dead_lettered_at)
    WHERE status = 'dead_letter';

-- Rows that must not be sent late: found and dead-lettered by webhooks.expire_deliveries().
CREATE INDEX alert_delivery_queue_expiry
    ON webhooks.alert_delivery_queue (expires_at)
    WHERE expires_at IS NOT NULL AND status IN ('pending', 'retrying');

CREATE FUNCTION webhooks.fill_idempotency_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.idempotency_key IS NULL THEN
        NEW.idempotency_key := NEW.event_id;
    END IF;
    IF NEW.expires_at IS NULL THEN
        -- the endpoint's default time to live, if it has one
        SELECT now() + e.delivery_ttl INTO NEW.expires_at FROM webhooks.endpoints e WHERE e.id = NEW.webhook_id;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TRIGGER fill_idempotency_key
    BEFORE INSERT ON webhooks.alert_delivery_queue
    FOR EACH ROW EXECUTE FUNCTION webhooks.fill_idempotency_key();
