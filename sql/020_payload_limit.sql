-- 020_payload_limit: payloads above webhooks.delivery_config.max_payload_bytes (default 256 KiB,
-- measured as the JSON text the receiver gets) are refused at enqueue with a clear error, never
-- truncated. Every way in (plain INSERT, enqueue(), publish(), the fan-out trigger) passes through
-- this BEFORE INSERT trigger, so the limit holds for all of them. The error is SQLSTATE 54000
-- (program_limit_exceeded): a trigger author who would rather drop an oversized event than abort
-- the application's transaction catches that code around the insert.

ALTER TABLE webhooks.delivery_config
    ADD COLUMN max_payload_bytes integer NOT NULL DEFAULT 262144
        CHECK (max_payload_bytes BETWEEN 1024 AND 104857600);

CREATE OR REPLACE FUNCTION webhooks.fill_idempotency_key() RETURNS trigger
LANGUAGE plpgsql
-- Runs for producers that may not read endpoints or the config (see 022_roles).
SECURITY DEFINER SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_limit integer;
    v_size  integer;
BEGIN
    SELECT c.max_payload_bytes INTO v_limit FROM webhooks.delivery_config c;
    -- The text form is what is sent; the stored (binary, maybe compressed) size is no bound on it.
    v_size := octet_length(NEW.payload::text);
    IF v_size > v_limit THEN
        RAISE EXCEPTION 'webhook payload is % bytes; the limit is % bytes', v_size, v_limit
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Send a smaller payload (for example an id the receiver looks up), or raise '
                         'webhooks.delivery_config.max_payload_bytes.';
    END IF;
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
