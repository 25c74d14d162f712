-- 029_table_triggers: webhooks from an application's own tables, registered by name.
--
-- A table trigger (functions/triggers.sql) turns the inserts, updates and deletes of one table into
-- events of one type, queued through the gate in the writer's own transaction, by statement-level
-- PostgreSQL triggers with transition tables that call webhooks.table_trigger_fire(). This table
-- registers them. Columns are kept by number (attnum), not by name, so that renaming a column keeps
-- a registration meaning the same column; their names are read from the catalog when shown and
-- when the trigger fires. The table itself is kept by OID, so a renamed table keeps its trigger,
-- and a dropped one is seen to be gone (its triggers go with it; the registration stays, shown as
-- such, until dropped).
CREATE TABLE webhooks.table_triggers (
    id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- part of the PostgreSQL triggers' names (webhooks_<name>_<op>, at most 63 bytes)
    name             text        NOT NULL UNIQUE
        CONSTRAINT table_trigger_name_form CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$'),
    table_oid        oid         NOT NULL,
    -- the table's names when it was registered: shown once the table is gone
    table_schema     text        NOT NULL,
    table_name       text        NOT NULL,
    ops              text[]      NOT NULL
        CONSTRAINT table_trigger_ops CHECK (cardinality(ops) BETWEEN 1 AND 3
                                            AND ops <@ ARRAY['insert', 'update', 'delete']),
    event_type       text        NOT NULL
        CONSTRAINT table_trigger_event_type_form
        CHECK (octet_length(event_type) BETWEEN 1 AND 256 AND event_type !~ '[[:cntrl:]]'
               AND strpos(event_type, '*') = 0 AND NOT starts_with(event_type, 'webhook.')),
    -- an update fires when one of these changed; NULL: any column but the excluded ones
    watched_columns  smallint[],
    -- never in a payload, in any op
    excluded_columns smallint[]  NOT NULL DEFAULT '{}',
    -- the primary key's columns when registered: the row's key (event ids, ordering key)
    key_columns      smallint[]  NOT NULL CONSTRAINT table_trigger_key CHECK (cardinality(key_columns) >= 1),
    -- the condition rows must meet, as PostgreSQL wrote it back, naming its columns as they were
    -- named then (when_names), which are when_columns: evaluated with the columns' current names
    -- given those names, so a renamed column keeps working
    when_condition   text,
    when_columns     smallint[],
    when_names       text[],
    -- the tenant whose subscribers get the events, or the column naming each row's tenant
    tenant_id        bigint      REFERENCES webhooks.tenants (id),
    tenant_column    smallint,
    enabled          boolean     NOT NULL DEFAULT true,
    created_by       text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT table_trigger_one_tenant CHECK ((tenant_id IS NULL) <> (tenant_column IS NULL)),
    CONSTRAINT table_trigger_when_together
        CHECK ((when_condition IS NULL) = (when_columns IS NULL) AND (when_columns IS NULL) = (when_names IS NULL))
);

COMMENT ON TABLE webhooks.table_triggers IS
    'Table triggers: a table''s inserts, updates and deletes queued as events of one type.';

-- A backfill of a table trigger is a bulk operation as a bulk replay is: a row of api_operations,
-- stepped by the API's runner (api_replay_step()), resumable and cancellable. It reads the table by
-- its primary key, a page a step: position is the last key read, scanned the rows read,
-- total_estimate what the table held when it started (pg_class.reltuples: a count would read it
-- all), for its progress.
ALTER TABLE webhooks.api_operations
    DROP CONSTRAINT api_operations_kind_check,
    ADD CONSTRAINT api_operations_kind_check CHECK (kind IN ('replay_dead_letters', 'trigger_backfill')),
    ADD COLUMN position jsonb,
    ADD COLUMN scanned bigint NOT NULL DEFAULT 0,
    ADD COLUMN total_estimate bigint;

-- A request the gate queues as a dead letter at once, with this category and reason (a table's row
-- that cannot be sent: too large for the payload limit, or naming no known tenant). Nothing is
-- stored in this shape, so the type takes the attributes in place.
ALTER TYPE webhooks.delivery_request
    ADD ATTRIBUTE dead_letter_category text,
    ADD ATTRIBUTE dead_letter_reason text;

-- The messages a table trigger queued (metadata table_trigger: its name), by time: what
-- table_trigger_list() counts for the deliveries of the last hour. Other messages are not in it.
CREATE INDEX messages_table_trigger ON webhooks.messages ((metadata ->> 'table_trigger'), created_at)
    WHERE metadata ? 'table_trigger';
