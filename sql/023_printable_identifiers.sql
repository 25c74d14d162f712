-- 023_printable_identifiers: the event type and the idempotency key travel in HTTP headers
-- (webhook-event-type, webhook-id), so they may not contain control characters: a CR or LF there
-- would be a header injection. Refused at insert with the constraint's name in the error. Bounded in
-- length for the same reason (a header line has a limit at every receiver). Non-ASCII text is
-- allowed: the worker percent-encodes it in headers. NOT VALID: existing rows are not rescanned.

ALTER TABLE webhooks.alert_delivery_queue
    ADD CONSTRAINT event_type_printable
        CHECK (event_type !~ '[[:cntrl:]]' AND octet_length(event_type) <= 256) NOT VALID,
    ADD CONSTRAINT idempotency_key_printable
        CHECK (idempotency_key !~ '[[:cntrl:]]' AND octet_length(idempotency_key) <= 512) NOT VALID;
