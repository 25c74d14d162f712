-- 012_endpoint_deletion: an endpoint can be deleted once none of its deliveries is unfinished
-- (pending, delivering or retrying). Its finished rows (delivered, dead-lettered) and its audit
-- (the attempt log, endpoint_events) stay as history: the queue and endpoint_events no longer hold
-- a foreign key to the endpoint (the queue's insert trigger refuses a row for an endpoint that
-- does not exist, as the key did), and the deleted endpoint's id and name stay readable here.
-- Its name can be used again; the history names the old endpoint by its id, which is never reused.

CREATE TABLE webhooks.deleted_endpoints (
    id         bigint      PRIMARY KEY,
    name       text        NOT NULL,
    tenant_id  bigint,
    deleted_at timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE webhooks.alert_delivery_queue DROP CONSTRAINT alert_delivery_queue_webhook_id_fkey;
ALTER TABLE webhooks.endpoint_events DROP CONSTRAINT endpoint_events_webhook_id_fkey;
