-- 004_coalescing: alert storms go out as digests, one request for many rows.
--
-- An endpoint may set coalesce_max (and optionally coalesce_window): when more of its rows are due
-- than its limits let through now (or its oldest due row has waited coalesce_window), a claim takes
-- up to coalesce_max due rows together and the worker sends them as one request, a digest. A lone
-- row is never held back for company (acquire() in functions/claim.sql).
--
-- Every member keeps its own row, lease token, attempts and audit history. The queue's digest_id
-- keeps a failed digest's members together, so it is claimed again as the same group and sent with
-- the same webhook-id; the audit log's digest_id records the digest that carried each attempt.


ALTER TABLE webhooks.endpoints
    ADD COLUMN coalesce_max integer,
    ADD COLUMN coalesce_window interval,
    ADD CONSTRAINT endpoints_coalesce_max_range CHECK (coalesce_max BETWEEN 2 AND 1000),
    ADD CONSTRAINT endpoints_coalesce_window_range
        CHECK (coalesce_window >= interval '0' AND coalesce_window <= interval '1 hour'),
    ADD CONSTRAINT endpoints_coalesce_window_needs_max
        CHECK (coalesce_window IS NULL OR coalesce_max IS NOT NULL),
    -- PagerDuty groups by dedup_key itself, and a raw body has no shape to put several in
    ADD CONSTRAINT endpoints_coalesce_format
        CHECK (coalesce_max IS NULL OR body_format IN ('slack', 'mattermost', 'envelope'));

COMMENT ON COLUMN webhooks.endpoints.coalesce_max IS
    'Digest size: with more rows due than the limits let through, up to this many go as one request';
COMMENT ON COLUMN webhooks.endpoints.coalesce_window IS
    'Also coalesce once the oldest due row has waited this long (NULL: only when held by the limits)';

CREATE SEQUENCE webhooks.digest_id_seq;

-- The digest a row is in while it is claimable or in flight; cleared when the row finishes.
ALTER TABLE webhooks.alert_delivery_queue ADD COLUMN digest_id bigint;
-- The digest that carried this attempt: "delivered in digest d-17 with 36 others".
ALTER TABLE webhooks.alert_delivery_log ADD COLUMN digest_id bigint;

CREATE INDEX alert_delivery_queue_digest ON webhooks.alert_delivery_queue (digest_id)
    WHERE digest_id IS NOT NULL AND status IN ('pending', 'retrying', 'delivering');
CREATE INDEX alert_delivery_log_digest ON webhooks.alert_delivery_log (digest_id)
    WHERE digest_id IS NOT NULL;
