-- 023_secret_rotated_event: rotating an endpoint's signing secret is an operational event.
--
-- rotate_secret() records it in endpoint_events (who, and until when the earlier secrets sign) and
-- queues webhook.endpoint.secret_rotated for the endpoints of the same tenant that subscribe to it
-- explicitly, as the other state changes are (functions/endpoints.sql). The worker's own types are
-- in the catalogue, so that subscriptions to them are not shown as subscribing to nothing.

INSERT INTO webhooks.event_types (name, description) VALUES
    ('webhook.endpoint.secret_rotated', 'An endpoint of the tenant had its signing secret rotated')
ON CONFLICT (name) DO NOTHING;
-- the catalogue changed: API processes read their entries afresh
UPDATE webhooks.event_types_version SET version = version + 1;
