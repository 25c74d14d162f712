-- 023_printable_identifiers: the event type and the idempotency key travel in HTTP headers
-- (webhook-event-type, webhook-id), so a row waiting to be sent may not hold control characters in
-- them (a CR or LF there would be a header injection) and they are bounded in length (a header line
-- has a limit at every receiver). Refused at insert, naming the constraint. Non-ASCII text is
-- allowed: the worker percent-encodes it in headers.
--
-- Rows already queued with such identifiers could never have been sent (the HTTP client refuses
-- them), so they become dead letters here, with the reason. Finished rows are not checked, so the
-- history stays as it was (NOT VALID: no rescan of the table); replaying such a dead letter fails
-- with the constraint's name.

UPDATE webhooks.alert_delivery_queue
SET status = 'dead_letter', dead_letter_reason = 'event type or idempotency key cannot be sent in a header',
    failure_category = 'internal', dead_lettered_at = now(), updated_at = now(),
    locked_by = NULL, lease_token = NULL, locked_until = NULL
WHERE status IN ('pending', 'retrying', 'delivering')
  AND (event_type ~ '[[:cntrl:]]' OR octet_length(event_type) > 256
       OR idempotency_key ~ '[[:cntrl:]]' OR octet_length(idempotency_key) > 512);

ALTER TABLE webhooks.alert_delivery_queue
    ADD CONSTRAINT event_type_printable
        CHECK (status IN ('delivered', 'dead_letter')
               OR (event_type !~ '[[:cntrl:]]' AND octet_length(event_type) <= 256)) NOT VALID,
    ADD CONSTRAINT idempotency_key_printable
        CHECK (status IN ('delivered', 'dead_letter')
               OR (idempotency_key !~ '[[:cntrl:]]' AND octet_length(idempotency_key) <= 512)) NOT VALID;
