-- 018_api_publish_round_trips: the catalogue of event types gets a version, so that an API process
-- may keep the entries it read and still see a change from the next publish on.
--
-- Every change to webhooks.event_types moves the version, in the changing transaction (the trigger
-- event_types_changed, functions/event_types.sql), so the version and the rows are seen together.
-- An API process reads the version with the entries (api_publish_check()) and names it in each
-- publish that used them (api_publish_as(), api_publish_batch_as(): refused when it moved, and the
-- API reads the catalogue again). Those functions, which also check the token in the publish's own
-- statement, need this table; API_SCHEMA_VERSION names this migration.

CREATE TABLE webhooks.event_types_version (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    version  bigint  NOT NULL DEFAULT 1
);

COMMENT ON TABLE webhooks.event_types_version IS
    'The event-type catalogue''s version: moved by every change to webhooks.event_types.';

INSERT INTO webhooks.event_types_version DEFAULT VALUES;
