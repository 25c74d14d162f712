-- triggers: webhooks from an application's own tables, registered by name (the table:
-- migrations/029_table_triggers.sql). One function per command of the CLI's `triggers` group:
--   SELECT webhooks.table_trigger_add('orders', 'public.orders', ARRAY['insert', 'update', 'delete'],
--                                     'order.changed', p_exclude_columns => ARRAY['card_token'],
--                                     p_when => 'status <> ''draft''', p_tenant_column => 'tenant');
--   SELECT * FROM webhooks.table_trigger_list();         -- GET /v1/triggers, the console
--   SELECT * FROM webhooks.table_trigger_show('orders');
--   SELECT webhooks.table_trigger_disable('orders');      -- and table_trigger_enable
--   SELECT webhooks.table_trigger_drop('orders');
--   SELECT webhooks.table_trigger_backfill('orders', p_where => 'created_at > ''2026-01-01''', p_rate => 500);
--   SELECT webhooks.table_trigger_invoke('orders', p_key => '42');
--
-- What fires. table_trigger_add() installs, with the caller's own rights, one statement-level
-- trigger per operation (webhooks_<name>_<op>, AFTER INSERT / UPDATE / DELETE, FOR EACH STATEMENT,
-- with transition tables) that calls table_trigger_fire(). Per statement, in the writer's
-- transaction, it turns the statement's rows into events of the trigger's type in one set-based
-- step: every insert and delete, and every update in which a watched column changed (default: any
-- column but the excluded ones), of the rows that meet its `when` condition (on the row as the
-- statement leaves it: the new row, the old one for a delete). They are queued through the gate
-- (queue_deliveries(), caller 'trigger': the trigger's tenant's subscribers, never refused for a
-- quota), so a rollback queues nothing and every rule of the queue holds.
--
-- The payload (its JSON Schema, table_trigger_payload_schema(), is put in the event-type catalogue
-- for the trigger's type when the type has none):
--   {"op": "insert" | "update" | "delete" | "backfill" | "manual",
--    "table": {"schema": "public", "name": "orders"}, "key": {"id": 42},
--    "old": {…} | null, "new": {…} | null, "changed": ["status"], "trigger": "orders"}
-- old and new are the row (to_jsonb: the table's columns as they are now, so a column added or
-- renamed shows at once, a dropped one is gone) without the excluded columns, which never leave
-- the database in any op. changed lists the payload's columns whose values differ (an update's;
-- empty for the other ops). key is the row's primary key.
--
-- Guarantees. The event id is derived from the transaction, the trigger, the op, the row's key and,
-- for an insert, update or delete, the change (an md5 of the payload: the row before and after), so
-- each different change of a row in a transaction is its own event and the same change made again
-- queues nothing twice (a row changed back and then the same way again repeats an earlier change's
-- id: that repeat is not queued). A backfill's derive from the operation and the row instead, an
-- invoke's from the transaction and the row. The ordering key is the table and the row's key, so one
-- row's changes reach each endpoint in order. A row whose payload is over max_payload_bytes does
-- not fail the write: each subscriber gets a dead letter (category too_large) whose payload is the
-- row's op, table and key only, with a reason naming the key. With a tenant column, a row naming no
-- tenant, or one that does not exist, is the same kind of dead letter (category unknown_tenant) for
-- the subscribers of the `default` tenant, the operator's, never another tenant's.
--
-- Rights. Installing needs the table's owner or its TRIGGER privilege: the PostgreSQL triggers are
-- made by table_trigger_add(), which runs as its caller; a login without either is refused
-- (SQLSTATE 42501) naming the table and the right. table_trigger_fire() runs as the schema owner
-- (SECURITY DEFINER, fixed search_path), so the application's roles need no right on the queue.
-- What it runs of the operator's is data, never code that could act as the owner: the `when`
-- condition (and a backfill's `where`) is parsed by PostgreSQL as the caller, as a generated
-- column of a copy of the table's columns in the caller's own temporary schema (so it references
-- only the table's columns, with no subquery, and only immutable functions), and the owner keeps
-- PostgreSQL's own text of it only when every function, operator and type it uses is PostgreSQL's
-- own (a domain of the application's, whose check could run its code, is refused). A row is
-- converted with to_jsonb() unless a type of its columns has a cast to json (which to_jsonb() would
-- call as the owner): those columns are sent as their text (table_row_json_sql()). A condition is
-- text the owner parses again each time, so a cast of the application's that a column it reads could
-- reach (added, or reached through a column's new type, after the condition was checked) makes the
-- rows dead letters (category internal) saying so, and refuses a backfill or an invoke whose key
-- or conditions would reach one (table_columns_casts()).
-- Backfill and invoke read the table as the schema owner, which needs USAGE on its schema and
-- SELECT on it; they say so when it has not. The role that asks for them must hold SELECT on the
-- table too: they send its rows.
--
-- Schema changes. Columns are registered by number, so a rename keeps the trigger (a condition
-- reads the renamed column by the name it had, table_condition_sql()); an added column is in the
-- payloads at once; a dropped one is gone from them (a condition that read it makes each row a
-- dead letter, category internal, saying so: add the trigger again), as does a primary key that is
-- no longer the registered one (each row its own dead letter: rows could share a key or have none).
-- A partitioned table is backfilled and invoked with its partitions. Its triggers fire for statements
-- on it (rows routed to a partition included), never for one that names a partition (PostgreSQL fires
-- a statement's triggers on the table it names): table_trigger_add() says so. A dropped table takes its
-- triggers with it; the registration stays, listed as `table dropped`, until dropped.
--
-- Backfill is a bulk operation (api_operations, kind trigger_backfill) that the API's runner steps
-- as it steps a bulk replay (api_replay_step() hands it to table_trigger_backfill_step()): a page
-- of rows by primary key a step, at its rate, recording where it got to, so it resumes after a kill
-- and stops when cancelled (api_cancel_operation()); its event ids derive from the operation and
-- the row, so a page read again queues nothing twice. Invoke queues one row now, as op manual.
--
-- Grants: adding, changing, dropping, backfilling and invoking to webhooks_admin; listing also to
-- webhooks_tenant_admin, which sees the triggers of its own tenant (a trigger with a tenant column
-- serves several and is not shown to one).

-- The JSON Schema of a table trigger's payload: what the catalogue holds for its event type.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_payload_schema() RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT '{
      "$schema": "https://json-schema.org/draft/2020-12/schema",
      "title": "A row of a table changed",
      "type": "object",
      "required": ["op", "table", "key", "old", "new", "changed", "trigger"],
      "properties": {
        "op": {"enum": ["insert", "update", "delete", "backfill", "manual"],
               "description": "what happened to the row: backfill and manual are rows queued on request"},
        "table": {"type": "object", "required": ["schema", "name"],
                  "properties": {"schema": {"type": "string"}, "name": {"type": "string"}}},
        "key": {"type": "object", "description": "the row''s primary key, column by column"},
        "old": {"type": ["object", "null"], "description": "the row before an update or a delete, without the excluded columns"},
        "new": {"type": ["object", "null"], "description": "the row after an insert or an update, or as read by a backfill or an invoke, without the excluded columns"},
        "changed": {"type": "array", "items": {"type": "string"},
                    "description": "the columns an update changed (of those in the payload); empty for other ops"},
        "trigger": {"type": "string", "description": "the table trigger''s name"}
      }
    }'::jsonb;
$$;

-- The role a call acts as: the one the session SET, or its login (a SECURITY DEFINER function
-- changes current_user, not this).
CREATE OR REPLACE FUNCTION webhooks.acting_role() RETURNS name
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN current_setting('role') = 'none' THEN session_user ELSE current_setting('role')::name END;
$$;

-- A domain's base type (through domains of domains); any other type itself.
CREATE OR REPLACE FUNCTION webhooks.base_type(p_type oid) RETURNS oid
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE d(oid, base) AS (
        SELECT t.oid, t.typbasetype FROM pg_catalog.pg_type t WHERE t.oid = p_type
        UNION ALL
        SELECT t.oid, t.typbasetype FROM d JOIN pg_catalog.pg_type t ON t.oid = d.base
    )
    SELECT d.oid FROM d WHERE d.base = 0;
$$;

-- The expression that turns a row of this table (the range variable p_row) into JSON as the
-- schema owner may: NULL when to_jsonb(p_row) may be used, which is so unless a type some column
-- reaches (through domains, arrays and composites) has a cast to json, a function of whoever owns
-- that type that to_jsonb() would call. Then those columns are taken as their text output
-- (format('%s'), which calls the type's output function, never a cast) and the rest as to_jsonb().
-- p_json_as_text: the values of columns that reach the type json and hold \u0000, which jsonb
-- refuses, are taken as their text too; NULL when there are no such columns.
CREATE OR REPLACE FUNCTION webhooks.table_row_json_sql(p_table oid, p_row text,
                                                        p_json_as_text boolean DEFAULT false) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_sql text;
BEGIN
    -- PostgreSQL's own types have no such cast: the usual case costs one look at the columns
    IF NOT p_json_as_text AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = p_table AND a.attnum > 0
                                          AND NOT a.attisdropped AND a.atttypid >= 16384) THEN
        RETURN NULL;
    END IF;
    WITH RECURSIVE reach(attnum, type) AS (
        SELECT a.attnum, a.atttypid FROM pg_attribute a
        WHERE a.attrelid = p_table AND a.attnum > 0 AND NOT a.attisdropped AND (a.atttypid >= 16384 OR p_json_as_text)
        UNION
        SELECT r.attnum, x.type
        FROM reach r JOIN pg_type t ON t.oid = r.type
        CROSS JOIN LATERAL (SELECT t.typbasetype UNION ALL SELECT t.typelem
                            UNION ALL SELECT a.atttypid FROM pg_attribute a
                                      WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped) x(type)
        WHERE x.type <> 0
    ), cast_columns AS (
        SELECT r.attnum, bool_and(r.json) AS json FROM (
            SELECT r.attnum, false AS json FROM reach r
            JOIN pg_cast c ON c.castsource = r.type AND c.casttarget = 'json'::regtype AND c.castmethod = 'f'
            WHERE r.type >= 16384
            UNION ALL
            SELECT r.attnum, true FROM reach r WHERE p_json_as_text AND r.type = 'json'::regtype) r
        GROUP BY r.attnum
    )
    SELECT CASE WHEN count(c.attnum) = 0 THEN NULL ELSE
               '(SELECT jsonb_object_agg(webhooks_column.k, webhooks_column.v) FROM (VALUES '
               || string_agg(format('(%L, %s)', a.attname,
                                    CASE WHEN c.attnum IS NULL THEN format('to_jsonb(%s.%I)', p_row, a.attname)
                                         -- only the values that hold \u0000 (their text, conservatively)
                                         WHEN c.json THEN format('CASE WHEN strpos(format(''%%s'', %1$s.%2$I), %3$L) > 0 '
                                                                 'THEN to_jsonb(format(''%%s'', %1$s.%2$I)) '
                                                                 'ELSE to_jsonb(%1$s.%2$I) END', p_row, a.attname, '\u0000')
                                         ELSE format('to_jsonb(format(''%%s'', %s.%I))', p_row, a.attname) END),
                             ', ' ORDER BY a.attnum)
               || ') AS webhooks_column(k, v))' END
    INTO v_sql
    FROM pg_attribute a LEFT JOIN cast_columns c ON c.attnum = a.attnum
    WHERE a.attrelid = p_table AND a.attnum > 0 AND NOT a.attisdropped;
    RETURN v_sql;
END;
$$;

-- The casts of the application's (functions outside pg_catalog, from or to a type these columns
-- reach through domains, arrays, composites and ranges) that SQL the schema owner parses over these
-- columns could call: a condition's text, a key's text cast to its type. They are looked for each
-- time such SQL runs, since a type's owner may add a cast, or a column's type change, after a
-- condition was checked. Described, or NULL when there is none.
CREATE OR REPLACE FUNCTION webhooks.table_columns_casts(p_table oid, p_columns smallint[]) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    WITH RECURSIVE reach(type) AS (
        SELECT a.atttypid FROM pg_attribute a
        WHERE a.attrelid = p_table AND a.attnum = ANY (p_columns) AND NOT a.attisdropped AND a.atttypid >= 16384
        UNION
        SELECT x.type
        FROM reach r JOIN pg_type t ON t.oid = r.type
        CROSS JOIN LATERAL (SELECT t.typbasetype UNION ALL SELECT t.typelem
                            UNION ALL SELECT g.rngsubtype FROM pg_range g WHERE g.rngtypid = t.oid
                            UNION ALL SELECT a.atttypid FROM pg_attribute a
                                      WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped) x(type)
        WHERE x.type >= 16384
    )
    SELECT string_agg(DISTINCT pg_describe_object('pg_cast'::regclass, c.oid, 0), ', ')
    FROM reach r
    JOIN pg_cast c ON (c.castsource = r.type OR c.casttarget = r.type) AND c.castmethod = 'f'
    JOIN pg_proc p ON p.oid = c.castfunc
    WHERE p.pronamespace <> 'pg_catalog'::regnamespace;
$$;

-- A condition (a trigger's `when`, a backfill's `where`), as the caller: PostgreSQL parses it as a
-- generated column of a temporary copy of the table's columns (so it is a boolean expression of
-- them alone: no subquery, no aggregate, immutable functions only), in the caller's own temporary
-- schema. Whatever the text holds runs as the caller, who could run it by hand; the schema owner
-- reads back only what PostgreSQL stored (table_condition_read()). The copy's OID.
CREATE OR REPLACE FUNCTION webhooks.table_condition_check(p_table oid, p_condition text) RETURNS oid
LANGUAGE plpgsql
-- as its caller, with PostgreSQL's names only: the condition's functions and types resolve there
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_columns text;
BEGIN
    SELECT string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)), ', ' ORDER BY a.attnum)
    INTO v_columns
    FROM pg_attribute a WHERE a.attrelid = p_table AND a.attnum > 0 AND NOT a.attisdropped;
    IF to_regclass('pg_temp.webhooks_condition_check') IS NOT NULL THEN
        DROP TABLE pg_temp.webhooks_condition_check;
    END IF;
    EXECUTE format('CREATE TEMPORARY TABLE webhooks_condition_check (%s) ON COMMIT DROP', v_columns);
    BEGIN
        EXECUTE format('ALTER TABLE pg_temp.webhooks_condition_check ADD COLUMN webhooks_condition boolean '
                       'GENERATED ALWAYS AS ((%s)) STORED', p_condition);
    EXCEPTION WHEN syntax_error OR undefined_column OR undefined_function OR undefined_object
                   OR datatype_mismatch OR invalid_object_definition OR feature_not_supported
                   OR grouping_error OR windowing_error OR invalid_text_representation
                   OR ambiguous_column OR ambiguous_function OR undefined_table OR wrong_object_type THEN
        RAISE EXCEPTION 'condition %: %', p_condition, SQLERRM
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A condition is a boolean SQL expression of the table''s columns, such as '
                         'status = ''paid'' AND amount > 100, using PostgreSQL''s immutable functions only.';
    END;
    RETURN 'pg_temp.webhooks_condition_check'::regclass;
END;
$$;

GRANT EXECUTE ON FUNCTION webhooks.table_condition_check(oid, text) TO webhooks_admin;

-- What the owner keeps of a condition the caller's table_condition_check() parsed: PostgreSQL's
-- text of it, the table's columns it reads (by number) and the names it reads them by (the
-- dependencies PostgreSQL recorded for it: none on its own objects, which are pinned). Refused:
-- anything but this session's own check of this table's columns, and any function, operator or
-- type that is not PostgreSQL's own (a domain of the application's: its check could run its code).
CREATE OR REPLACE FUNCTION webhooks.table_condition_read(p_table oid, p_check oid, p_condition text,
                                                         OUT condition text, OUT columns smallint[],
                                                         OUT names text[])
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_default oid;
    v_refused text;
BEGIN
    SELECT d.oid, pg_get_expr(d.adbin, d.adrelid) INTO v_default, condition
    FROM pg_class c
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'webhooks_condition' AND a.attgenerated = 's'
    JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
    WHERE c.oid = p_check AND c.relnamespace = pg_my_temp_schema();
    IF v_default IS NULL THEN
        RAISE EXCEPTION 'condition %: not checked in this session', p_condition USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT string_agg(CASE
               WHEN d.refclassid = 'pg_class'::regclass AND d.refobjid = p_check AND d.refobjsubid > 0 THEN NULL
               WHEN d.refclassid = 'pg_proc'::regclass AND p.pronamespace = 'pg_catalog'::regnamespace THEN NULL
               WHEN d.refclassid = 'pg_operator'::regclass AND o.oprnamespace = 'pg_catalog'::regnamespace THEN NULL
               WHEN d.refclassid = 'pg_type'::regclass AND (t.typnamespace = 'pg_catalog'::regnamespace
                                                          OR t.typtype IN ('e', 'b')) THEN NULL
               WHEN d.refclassid IN ('pg_collation'::regclass, 'pg_ts_config'::regclass, 'pg_ts_dict'::regclass) THEN NULL
               ELSE pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid) END, ', ')
    INTO v_refused
    FROM pg_depend d
    LEFT JOIN pg_proc p ON d.refclassid = 'pg_proc'::regclass AND p.oid = d.refobjid
    LEFT JOIN pg_operator o ON d.refclassid = 'pg_operator'::regclass AND o.oid = d.refobjid
    LEFT JOIN pg_type t ON d.refclassid = 'pg_type'::regclass AND t.oid = d.refobjid
    WHERE d.classid = 'pg_attrdef'::regclass AND d.objid = v_default AND d.deptype <> 'i';
    IF v_refused IS NOT NULL THEN
        RAISE EXCEPTION 'condition %: uses %, which is not PostgreSQL''s own', p_condition, v_refused
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'A condition runs as the webhooks schema''s owner in every writer''s transaction, so it '
                         'may use PostgreSQL''s own functions, operators and types only.';
    END IF;
    -- the columns it reads: the table's own, of the same type as the copy's
    SELECT array_agg(r.attnum ORDER BY r.attnum), array_agg(r.attname::text ORDER BY r.attnum)
    INTO columns, names
    FROM pg_depend d
    JOIN pg_attribute k ON k.attrelid = p_check AND k.attnum = d.refobjsubid
    JOIN pg_attribute r ON r.attrelid = p_table AND r.attname = k.attname AND r.atttypid = k.atttypid
                       AND r.attnum > 0 AND NOT r.attisdropped
    WHERE d.classid = 'pg_attrdef'::regclass AND d.objid = v_default AND d.deptype <> 'i'
      AND d.refclassid = 'pg_class'::regclass AND d.refobjid = p_check AND d.refobjsubid > 0;
    IF (SELECT count(*) FROM pg_depend d WHERE d.classid = 'pg_attrdef'::regclass AND d.objid = v_default AND d.deptype <> 'i'
          AND d.refclassid = 'pg_class'::regclass AND d.refobjid = p_check AND d.refobjsubid > 0)
       <> coalesce(cardinality(columns), 0) THEN
        RAISE EXCEPTION 'condition %: it was not checked against this table''s columns', p_condition
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    columns := coalesce(columns, '{}');
    names := coalesce(names, '{}');
END;
$$;

-- The SQL of a stored condition on one row (the range variable p_row of the table or a transition
-- table): a scalar subquery that gives each column it reads the name the condition knows it by
-- (its name when the condition was given), so a renamed column keeps working. NULL when a column
-- it reads is gone.
CREATE OR REPLACE FUNCTION webhooks.table_condition_sql(p_table oid, p_condition text, p_columns smallint[],
                                                        p_names text[], p_row text) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT CASE WHEN count(a.attnum) = cardinality(p_columns) THEN
               format('(SELECT coalesce((%s), false) FROM (SELECT %s) AS webhooks_condition)', p_condition,
                      coalesce(string_agg(format('%s.%I AS %I', p_row, a.attname, c.name), ', ')
                                   FILTER (WHERE a.attnum IS NOT NULL), '1'))
           END
    FROM unnest(p_columns, p_names) AS c(attnum, name)
    LEFT JOIN pg_attribute a ON a.attrelid = p_table AND a.attnum = c.attnum AND NOT a.attisdropped;
$$;

-- A row's key as reasons name it, as PostgreSQL's own messages do: (id)=(42).
CREATE OR REPLACE FUNCTION webhooks.table_key_shown(p_columns text[], p_row jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT '(' || array_to_string(p_columns, ', ') || ')=('
           || (SELECT string_agg(coalesce(p_row ->> k, 'null'), ', ') FROM unnest(p_columns) k) || ')';
$$;

-- Queues the events of one trigger for rows of its table, through the gate: p_new and p_old are
-- the rows as JSON (to_jsonb), in the same order (an update's pairs), p_op the op, p_seed what the
-- event ids derive from besides the trigger, op and key (the transaction, or the backfill's
-- operation). p_broken: every row is a dead letter with this reason (category internal). Answers
-- the deliveries it made.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_queue(p_trigger webhooks.table_triggers, p_op text,
                                                        p_new jsonb[], p_old jsonb[], p_seed text,
                                                        p_schema text, p_table text, p_broken text DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
-- Planned once per session: its statements read only their parameters and the catalog by key
-- (and a tenant by name, by its index whatever the statistics say: not the whole table per row).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    v_limit    integer;
    v_columns  text[];  -- the payload's columns, in the table's order
    v_excluded text[];
    v_watched  text[];
    v_key      text[];
    v_tenant_column text;
    v_nonkey   text[];
    v_table    jsonb := jsonb_build_object('schema', p_schema, 'name', p_table);
    v_made     integer;
BEGIN
    SELECT coalesce(array_agg(a.attname::text ORDER BY a.attnum)
                        FILTER (WHERE NOT a.attnum = ANY (p_trigger.excluded_columns)), '{}'),
           coalesce(array_agg(a.attname::text) FILTER (WHERE a.attnum = ANY (p_trigger.excluded_columns)), '{}'),
           coalesce(array_agg(a.attname::text ORDER BY a.attnum) FILTER (WHERE a.attnum = ANY (p_trigger.watched_columns)),
                    '{}'),
           array_agg(a.attname::text ORDER BY array_position(p_trigger.key_columns, a.attnum))
               FILTER (WHERE a.attnum = ANY (p_trigger.key_columns)),
           min(a.attname::text) FILTER (WHERE a.attnum = p_trigger.tenant_column),
           coalesce(array_agg(a.attname::text) FILTER (WHERE NOT a.attnum = ANY (p_trigger.key_columns)), '{}'),
           (SELECT c.max_payload_bytes FROM webhooks.delivery_config c LIMIT 1)
    INTO v_columns, v_excluded, v_watched, v_key, v_tenant_column, v_nonkey, v_limit
    FROM pg_attribute a
    WHERE a.attrelid = p_trigger.table_oid AND a.attnum > 0 AND NOT a.attisdropped;
    IF p_trigger.watched_columns IS NULL THEN
        v_watched := v_columns;
    END IF;

    SELECT count(*) FILTER (WHERE g.created) INTO v_made
    FROM webhooks.queue_deliveries(ARRAY(
        SELECT ROW(e.o, NULL, p_trigger.event_type, e.event_id, NULL,
                   CASE WHEN e.category IS NULL THEN e.payload
                        ELSE jsonb_build_object('op', p_op, 'table', v_table, 'key', e.key, 'old', NULL, 'new', NULL,
                                                'changed', '[]'::jsonb, 'trigger', p_trigger.name) END,
                   jsonb_build_object('table_trigger', p_trigger.name), e.ref, NULL, e.ref, NULL, NULL, NULL, NULL,
                   CASE WHEN e.category = 'unknown_tenant' THEN 1 ELSE e.tenant_id END, NULL,
                   e.category,
                   CASE e.category
                       WHEN 'internal' THEN format('table trigger %s: %s', p_trigger.name, p_broken)
                       WHEN 'too_large' THEN format('row %s.%s %s: its payload is %s bytes, over the limit of %s bytes',
                                                    p_schema, p_table, webhooks.table_key_shown(v_key, e.rw), e.size, v_limit)
                       WHEN 'unknown_tenant' THEN
                           CASE WHEN e.tenant_name IS NULL
                                THEN format('row %s.%s %s names no tenant (column %s is null)', p_schema, p_table,
                                            webhooks.table_key_shown(v_key, e.rw), coalesce(v_tenant_column, '(dropped)'))
                                -- an excluded column's value never leaves the database, not even in a reason
                                WHEN p_trigger.tenant_column = ANY (p_trigger.excluded_columns)
                                THEN format('row %s.%s %s names a tenant that does not exist (column %s)', p_schema,
                                            p_table, webhooks.table_key_shown(v_key, e.rw), v_tenant_column)
                                ELSE format('row %s.%s %s names tenant %s, which does not exist', p_schema, p_table,
                                            webhooks.table_key_shown(v_key, e.rw), to_jsonb(e.tenant_name)) END END
               )::webhooks.delivery_request
        FROM (
            SELECT c.*,
                   CASE WHEN p_broken IS NOT NULL THEN 'internal'
                        WHEN p_trigger.tenant_column IS NOT NULL AND c.tenant_id IS NULL THEN 'unknown_tenant'
                        WHEN c.size > v_limit THEN 'too_large' END AS category
            FROM (
                SELECT b.*, octet_length(p.text) AS size,
                       -- a row's change: what it was and became is in the id, so another change of the
                       -- row in the transaction is another event, and the same change made again is not
                       'evt_' || md5(p_seed || ':' || p_trigger.id || ':' || p_op || ':' || coalesce(b.key_text, '')
                                     || CASE WHEN p_op IN ('insert', 'update', 'delete') THEN ':' || md5(p.text)
                                             ELSE '' END
                                     || CASE WHEN p_broken IS NULL THEN '' ELSE ':' || b.o END) AS event_id,
                       coalesce(p_trigger.tenant_id, (SELECT tn.id FROM webhooks.tenants tn WHERE tn.name = b.tenant_name)) AS tenant_id
                FROM (
                    SELECT r.o, r.rw, r.key, r.key_text, r.tenant_name,
                           left(p_schema || '.' || p_table || ':' || r.key_text, 1000) AS ref,
                           jsonb_build_object(
                               'op', p_op, 'table', v_table, 'key', r.key,
                               'old', CASE WHEN cardinality(v_excluded) = 0 THEN r.old_row ELSE r.old_row - v_excluded END,
                               'new', CASE WHEN cardinality(v_excluded) = 0 THEN r.new_row ELSE r.new_row - v_excluded END,
                               'changed', to_jsonb(r.changed), 'trigger', p_trigger.name) AS payload
                    FROM (
                        SELECT t.o, t.new_row, t.old_row, s.rw, s.rw ->> v_tenant_column AS tenant_name,
                               CASE WHEN cardinality(v_key) = 1 THEN jsonb_build_object(v_key[1], s.rw -> v_key[1])
                                    ELSE s.rw - v_nonkey END AS key,
                               CASE WHEN cardinality(v_key) = 1 THEN s.rw ->> v_key[1]
                                    ELSE (s.rw - v_nonkey)::text END AS key_text,
                               CASE WHEN p_op = 'update'
                                    THEN ARRAY(SELECT c FROM unnest(v_columns) c
                                               WHERE t.new_row -> c IS DISTINCT FROM t.old_row -> c)
                                    ELSE '{}' END AS changed
                        FROM unnest(p_new, p_old) WITH ORDINALITY AS t(new_row, old_row, o)
                        CROSS JOIN LATERAL (SELECT CASE WHEN p_op = 'delete' THEN t.old_row ELSE t.new_row END) AS s(rw)
                        WHERE p_op <> 'update' OR EXISTS (SELECT 1 FROM unnest(v_watched) w
                                                          WHERE t.new_row -> w IS DISTINCT FROM t.old_row -> w)
                    ) r
                ) b
                CROSS JOIN LATERAL (SELECT b.payload::text) AS p(text)
            ) c
        ) e
        ORDER BY e.o), 'trigger') g;
    RETURN v_made;
END;
$$;

-- The statement-level trigger every table trigger installs (its argument: the registration's id).
-- Runs as the schema owner; a registration that is disabled, gone or of another table queues
-- nothing. A trigger with a `when` condition evaluates it in one dynamic statement per statement.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_fire() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_trigger webhooks.table_triggers;
    v_op      text := lower(TG_OP);
    v_json    text;
    v_sql     text;
    v_new     jsonb[];
    v_old     jsonb[];
    v_pass    boolean[];
    v_broken  text;
    v_casts   text;
BEGIN
    SELECT * INTO v_trigger FROM webhooks.table_triggers t WHERE t.id = TG_ARGV[0]::bigint;
    IF NOT FOUND OR NOT v_trigger.enabled OR v_trigger.table_oid <> TG_RELID THEN
        RETURN NULL;
    END IF;
    v_json := webhooks.table_row_json_sql(TG_RELID, 'n');
    -- n.*, not n: a column named n would be read instead of the row
    IF v_json IS NULL AND NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = TG_RELID AND a.attnum > 0
                                      AND NOT a.attisdropped
                                      AND (a.atttypid >= 16384 OR a.atttypid IN ('json'::regtype, '_json'::regtype))) THEN
        -- PostgreSQL's own types, none of them json: no value jsonb refuses, no subtransaction needed
        IF v_op IN ('insert', 'update') THEN
            v_new := ARRAY(SELECT to_jsonb(n.*) FROM webhooks_new n);
        END IF;
        IF v_op IN ('update', 'delete') THEN
            v_old := ARRAY(SELECT to_jsonb(n.*) FROM webhooks_old n);
        END IF;
    ELSE
        BEGIN
            IF v_json IS NULL THEN
                IF v_op IN ('insert', 'update') THEN
                    v_new := ARRAY(SELECT to_jsonb(n.*) FROM webhooks_new n);
                END IF;
                IF v_op IN ('update', 'delete') THEN
                    v_old := ARRAY(SELECT to_jsonb(n.*) FROM webhooks_old n);
                END IF;
            ELSE
                IF v_op IN ('insert', 'update') THEN
                    EXECUTE format('SELECT ARRAY(SELECT %s FROM webhooks_new n)', v_json) INTO v_new;
                END IF;
                IF v_op IN ('update', 'delete') THEN
                    EXECUTE format('SELECT ARRAY(SELECT %s FROM webhooks_old n)', v_json) INTO v_old;
                END IF;
            END IF;
        EXCEPTION WHEN untranslatable_character OR invalid_text_representation THEN
            -- a json value jsonb refuses (\u0000) must not fail the write: such values go as their text
            v_json := webhooks.table_row_json_sql(TG_RELID, 'n', true);
            IF v_json IS NULL THEN
                RAISE;
            END IF;
            IF v_op IN ('insert', 'update') THEN
                EXECUTE format('SELECT ARRAY(SELECT %s FROM webhooks_new n)', v_json) INTO v_new;
            END IF;
            IF v_op IN ('update', 'delete') THEN
                EXECUTE format('SELECT ARRAY(SELECT %s FROM webhooks_old n)', v_json) INTO v_old;
            END IF;
        END;
    END IF;
    -- the key the registration keeps must still be the table's primary key: otherwise rows could share
    -- one (or have none) and their events merge
    IF NOT EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = TG_RELID AND i.indisprimary
                   AND i.indkey::smallint[] = v_trigger.key_columns) THEN
        v_broken := 'the table''s primary key is no longer the one it had when the trigger was added: add the '
                    'trigger again';
    END IF;
    IF cardinality(v_trigger.when_columns) > 0 THEN
        v_casts := webhooks.table_columns_casts(TG_RELID, v_trigger.when_columns);
    END IF;
    IF v_broken IS NULL AND v_casts IS NOT NULL THEN
        v_broken := format('its when condition reads a column whose type has a cast of the application''s (%s), '
                           'which would run as the webhooks schema''s owner: drop the cast, or add the trigger '
                           'again without that condition', v_casts);
    END IF;
    IF v_trigger.when_condition IS NOT NULL AND v_broken IS NULL THEN
        v_sql := webhooks.table_condition_sql(TG_RELID, v_trigger.when_condition, v_trigger.when_columns,
                                              v_trigger.when_names, 'n');
        IF v_sql IS NULL THEN
            v_broken := format('its when condition (%s) reads a column that was dropped: add the trigger again',
                               v_trigger.when_condition);
        ELSE
            -- the transition table is read in the same order as above
            BEGIN
                EXECUTE format('SELECT ARRAY(SELECT %s FROM %I n)', v_sql,
                               CASE WHEN v_op = 'delete' THEN 'webhooks_old' ELSE 'webhooks_new' END) INTO v_pass;
            EXCEPTION WHEN data_exception THEN
                -- the application's write goes on; the rows become dead letters saying why. Only the
                -- SQLSTATE is kept: PostgreSQL's message may quote a value of an excluded column.
                v_broken := format('its when condition (%s) failed on a row of this statement (SQLSTATE %s)',
                                   v_trigger.when_condition, SQLSTATE);
            END;
            IF v_broken IS NULL THEN
                SELECT array_agg(t.new_row ORDER BY t.o), array_agg(t.old_row ORDER BY t.o) INTO v_new, v_old
                FROM unnest(v_new, v_old, v_pass) WITH ORDINALITY AS t(new_row, old_row, pass, o)
                WHERE t.pass;
            END IF;
        END IF;
    END IF;
    IF coalesce(cardinality(v_new), cardinality(v_old), 0) > 0 THEN
        PERFORM webhooks.table_trigger_queue(v_trigger, v_op, v_new, v_old, pg_current_xact_id()::text,
                                             TG_TABLE_SCHEMA, TG_TABLE_NAME, v_broken);
    END IF;
    RETURN NULL;
END;
$$;
-- CREATE TRIGGER needs EXECUTE on it, as the caller of table_trigger_add()
GRANT EXECUTE ON FUNCTION webhooks.table_trigger_fire() TO webhooks_admin;

-- The registration, as the schema owner, after table_trigger_add() checked the condition as its
-- caller: every argument is checked again here (this is callable on its own), the caller's right
-- to add triggers to the table included. The type's JSON Schema goes in the catalogue when the
-- type has none. Answers the registration's id.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_register(
    p_name text, p_table oid, p_on text[], p_event_type text, p_columns text[], p_exclude_columns text[],
    p_when text, p_when_check oid, p_tenant text, p_tenant_column text)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_role      name := webhooks.acting_role();
    v_class     pg_class;
    v_schema    text;
    v_ops       text[];
    v_key       smallint[];
    v_watched   smallint[];
    v_excluded  smallint[];
    v_missing   text;
    v_tenant    bigint;
    v_tenant_column smallint;
    v_condition text;
    v_when_columns smallint[];
    v_when_names text[];
    v_id        bigint;
BEGIN
    SELECT * INTO v_class FROM pg_class c WHERE c.oid = p_table;
    IF NOT FOUND OR v_class.relkind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION 'table %: no such table', p_table USING ERRCODE = 'undefined_table';
    END IF;
    v_schema := (SELECT n.nspname FROM pg_namespace n WHERE n.oid = v_class.relnamespace);
    IF v_schema IN ('webhooks', 'pg_catalog', 'information_schema') OR v_class.relpersistence = 't' THEN
        RAISE EXCEPTION 'table %.%: a table trigger is for an application''s own tables', v_schema, v_class.relname
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF NOT (pg_has_role(v_role, v_class.relowner, 'USAGE') OR has_table_privilege(v_role, p_table, 'TRIGGER')) THEN
        RAISE EXCEPTION 'permission denied to add a table trigger to %.%: the role % must own it or hold its TRIGGER '
                        'privilege', v_schema, v_class.relname, v_role
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('The table''s owner can grant it: GRANT TRIGGER ON %I.%I TO %I', v_schema,
                                v_class.relname, v_role);
    END IF;
    IF p_name IS NULL OR p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$' THEN
        RAISE EXCEPTION 'table trigger name %: 1 to 40 letters, digits, ''_'', ''.'' or ''-'', starting with a '
                        'letter or digit', coalesce(to_jsonb(p_name)::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_ops := ARRAY(SELECT DISTINCT lower(btrim(o)) FROM unnest(p_on) o ORDER BY 1);
    IF cardinality(v_ops) = 0 OR NOT v_ops <@ ARRAY['insert', 'update', 'delete'] THEN
        RAISE EXCEPTION 'on %: one or more of insert, update, delete', coalesce(to_jsonb(p_on)::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_event_type IS NULL OR octet_length(p_event_type) NOT BETWEEN 1 AND 256 OR p_event_type ~ '[[:cntrl:]]'
       OR strpos(p_event_type, '*') > 0 THEN
        RAISE EXCEPTION 'event type %: 1 to 256 bytes, no control character, no ''*''',
                        coalesce(to_jsonb(p_event_type)::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM webhooks.refuse_reserved_catalogue_name(p_event_type);

    -- the primary key: every event's key
    SELECT i.indkey::smallint[] INTO v_key FROM pg_index i WHERE i.indrelid = p_table AND i.indisprimary;
    IF v_key IS NULL THEN
        RAISE EXCEPTION 'table %.% has no primary key: a table trigger needs one (each row''s events are '
                        'keyed and ordered by it)', v_schema, v_class.relname
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- columns by name, kept by number
    SELECT string_agg(to_jsonb(c.name)::text, ', ') INTO v_missing
    FROM unnest(coalesce(p_columns, '{}') || coalesce(p_exclude_columns, '{}')
                || CASE WHEN p_tenant_column IS NULL THEN '{}'::text[] ELSE ARRAY[p_tenant_column] END) AS c(name)
    WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = p_table AND a.attname = c.name
                      AND a.attnum > 0 AND NOT a.attisdropped);
    IF v_missing IS NOT NULL THEN
        RAISE EXCEPTION 'table %.% has no column %', v_schema, v_class.relname, v_missing
            USING ERRCODE = 'undefined_column';
    END IF;
    IF p_columns IS NOT NULL THEN
        v_watched := ARRAY(SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = p_table AND a.attname = ANY (p_columns)
                           AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum);
        IF cardinality(v_watched) = 0 THEN
            RAISE EXCEPTION 'columns: name at least one, or none to watch every column'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    v_excluded := ARRAY(SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = p_table
                        AND a.attname = ANY (coalesce(p_exclude_columns, '{}'))
                        AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum);
    IF v_excluded && v_key THEN
        RAISE EXCEPTION 'exclude columns: the primary key''s columns (%) are every event''s key and cannot be excluded',
                        (SELECT string_agg(a.attname, ', ') FROM pg_attribute a
                         WHERE a.attrelid = p_table AND a.attnum = ANY (v_key))
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF v_excluded && v_watched THEN
        RAISE EXCEPTION 'columns and exclude columns name the same column: an excluded column never leaves the '
                        'database, not even as a change'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_tenant IS NOT NULL AND p_tenant_column IS NOT NULL THEN
        RAISE EXCEPTION 'tenant and tenant column: give one of them (none: the default tenant)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_tenant_column IS NOT NULL THEN
        v_tenant_column := (SELECT a.attnum FROM pg_attribute a WHERE a.attrelid = p_table AND a.attname = p_tenant_column
                            AND a.attnum > 0 AND NOT a.attisdropped);
    ELSE
        v_tenant := webhooks.tenant_id(coalesce(p_tenant, 'default'));
    END IF;
    IF p_when IS NOT NULL THEN
        SELECT r.condition, r.columns, r.names INTO v_condition, v_when_columns, v_when_names
        FROM webhooks.table_condition_read(p_table, p_when_check, p_when) r;
    END IF;

    BEGIN
        INSERT INTO webhooks.table_triggers
            (name, table_oid, table_schema, table_name, ops, event_type, watched_columns, excluded_columns,
             key_columns, when_condition, when_columns, when_names, tenant_id, tenant_column, created_by)
        VALUES (p_name, p_table, v_schema, v_class.relname, v_ops, p_event_type, v_watched, v_excluded, v_key,
                v_condition, v_when_columns, v_when_names, v_tenant, v_tenant_column, v_role)
        RETURNING id INTO v_id;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'table trigger %: one of that name exists (drop it first)', p_name
            USING ERRCODE = 'unique_violation', CONSTRAINT = 'table_triggers_name_key';
    END;
    -- the payload's schema for its type, where the catalogue has none
    IF NOT EXISTS (SELECT 1 FROM webhooks.event_types t WHERE t.name = p_event_type) THEN
        PERFORM webhooks.upsert_event_type(p_event_type, format('A row of %I.%I changed (table trigger %s)',
                                                                v_schema, v_class.relname, p_name),
                                           webhooks.table_trigger_payload_schema());
    ELSIF (SELECT t.schema IS NULL FROM webhooks.event_types t WHERE t.name = p_event_type) THEN
        PERFORM webhooks.upsert_event_type(p_event_type, (SELECT t.description FROM webhooks.event_types t
                                                          WHERE t.name = p_event_type),
                                           webhooks.table_trigger_payload_schema());
    END IF;
    RETURN v_id;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.table_trigger_register(text, oid, text[], text, text[], text[], text, oid, text, text)
    TO webhooks_admin;

-- `triggers add`: registers the trigger and installs its PostgreSQL triggers on the table, with the
-- caller's own rights (this function runs as its caller). p_table is SCHEMA.TABLE; p_on some of
-- insert, update, delete; p_columns the columns whose change fires an update (NULL: any but the
-- excluded); p_exclude_columns those never sent; p_when a condition on the row; p_tenant the tenant
-- whose subscribers get the events (NULL: default) or p_tenant_column the column naming each row's
-- tenant. Answers the registration's id.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_add(
    p_name text, p_table text, p_on text[], p_event_type text,
    p_columns text[] DEFAULT NULL, p_exclude_columns text[] DEFAULT NULL, p_when text DEFAULT NULL,
    p_tenant text DEFAULT NULL, p_tenant_column text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_parts text[];
    v_table oid;
    v_check oid;
    v_id    bigint;
    v_op    text;
BEGIN
    BEGIN
        v_parts := parse_ident(coalesce(p_table, ''));
    EXCEPTION WHEN invalid_parameter_value THEN
        v_parts := NULL;
    END;
    IF cardinality(v_parts) IS DISTINCT FROM 2 THEN
        RAISE EXCEPTION 'table %: give it as SCHEMA.TABLE', coalesce(to_jsonb(p_table)::text, 'null')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT c.oid INTO v_table FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = v_parts[1] AND c.relname = v_parts[2] AND c.relkind IN ('r', 'p');
    IF v_table IS NULL THEN
        RAISE EXCEPTION 'table %: no such table', p_table USING ERRCODE = 'undefined_table';
    END IF;
    IF p_when IS NOT NULL THEN
        v_check := webhooks.table_condition_check(v_table, p_when);
    END IF;
    v_id := webhooks.table_trigger_register(p_name, v_table, p_on, p_event_type, p_columns, p_exclude_columns,
                                            p_when, v_check, p_tenant, p_tenant_column);
    IF v_check IS NOT NULL THEN
        DROP TABLE pg_temp.webhooks_condition_check;
    END IF;
    FOREACH v_op IN ARRAY (SELECT t.ops FROM webhooks.table_trigger_show(p_name) t) LOOP
        EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s REFERENCING %s FOR EACH STATEMENT '
                       'EXECUTE FUNCTION webhooks.table_trigger_fire(%L)',
                       'webhooks_' || p_name || '_' || v_op, upper(v_op), v_table::regclass,
                       CASE v_op WHEN 'insert' THEN 'NEW TABLE AS webhooks_new'
                                 WHEN 'update' THEN 'OLD TABLE AS webhooks_old NEW TABLE AS webhooks_new'
                                 ELSE 'OLD TABLE AS webhooks_old' END,
                       v_id);
    END LOOP;
    -- PostgreSQL fires a statement's triggers on the table it names only
    IF (SELECT c.relkind FROM pg_class c WHERE c.oid = v_table) = 'p' THEN
        RAISE NOTICE 'table %: partitioned: statements on % fire the trigger, with the rows they route to its '
                     'partitions; a statement that names a partition fires nothing', p_table, p_table
            USING HINT = 'Write through the partitioned table, or add a trigger to each partition written to directly.';
    END IF;
    RETURN v_id;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.table_trigger_add(text, text, text[], text, text[], text[], text, text, text)
    TO webhooks_admin;

-- Every table trigger, as `triggers list`, GET /v1/triggers and the console show them: its table (as
-- it is named now, or as it was when registered if it is gone), ops, event type, watched and
-- excluded columns and tenant column by their names now, its condition, enabled, state (enabled,
-- disabled; table dropped: the table is gone; trigger missing: its PostgreSQL triggers are not all
-- on the table, or one is disabled there), the deliveries it queued in the last hour, and its
-- latest backfill with its progress. A session kept to a tenant sees the triggers of its tenant.
CREATE OR REPLACE VIEW webhooks.table_trigger_summary AS
SELECT t.id, t.name,
       CASE WHEN c.oid IS NULL THEN format('%I.%I', t.table_schema, t.table_name)
            ELSE format('%I.%I', n.nspname, c.relname) END AS table_name,
       t.ops, t.event_type,
       CASE WHEN t.watched_columns IS NOT NULL THEN
           ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid
                 AND a.attnum = ANY (t.watched_columns) AND NOT a.attisdropped ORDER BY a.attnum) END AS columns,
       ARRAY(SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid
             AND a.attnum = ANY (t.excluded_columns) AND NOT a.attisdropped ORDER BY a.attnum) AS exclude_columns,
       t.when_condition, tn.name AS tenant,
       (SELECT a.attname::text FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum = t.tenant_column
          AND NOT a.attisdropped) AS tenant_column,
       t.enabled,
       CASE WHEN c.oid IS NULL THEN 'table dropped'
            WHEN (SELECT count(*) FROM pg_trigger g
                  WHERE g.tgrelid = c.oid AND g.tgfoid = 'webhooks.table_trigger_fire()'::regprocedure
                    AND g.tgenabled <> 'D'
                    AND g.tgname = ANY (ARRAY(SELECT 'webhooks_' || t.name || '_' || o FROM unnest(t.ops) o)))
                 < cardinality(t.ops) THEN 'trigger missing'
            WHEN NOT t.enabled THEN 'disabled'
            ELSE 'enabled' END AS state,
       (SELECT count(*) FROM webhooks.messages m
        JOIN webhooks.alert_delivery_queue q
          ON q.delivery_id BETWEEN m.first_delivery_id AND m.last_delivery_id AND q.message_id = m.message_id
        WHERE m.metadata ? 'table_trigger' AND m.metadata ->> 'table_trigger' = t.name
          AND m.created_at > now() - interval '1 hour') AS deliveries_last_hour,
       b.id AS backfill_id, b.status AS backfill_status, b.processed AS backfill_processed,
       b.scanned AS backfill_scanned, b.total_estimate AS backfill_total_estimate,
       t.created_by, t.created_at, t.updated_at
FROM webhooks.table_triggers t
LEFT JOIN pg_class c ON c.oid = t.table_oid AND c.relkind IN ('r', 'p')
LEFT JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN webhooks.tenants tn ON tn.id = t.tenant_id
LEFT JOIN LATERAL (SELECT o.id, o.status, o.processed, o.scanned, o.total_estimate
                   FROM webhooks.api_operations o
                   WHERE o.kind = 'trigger_backfill' AND (o.filter ->> 'trigger_id')::bigint = t.id
                   ORDER BY o.id DESC LIMIT 1) b ON true
-- a view runs as its owner, whom row-level security does not bind: it applies the tenant itself
WHERE (SELECT webhooks.caller_tenant()) IS NULL OR t.tenant_id = (SELECT webhooks.caller_tenant());
GRANT SELECT ON webhooks.table_trigger_summary TO webhooks_admin, webhooks_tenant_admin;

-- `triggers list`: every table trigger the caller sees, by name.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_list() RETURNS SETOF webhooks.table_trigger_summary
LANGUAGE sql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT * FROM webhooks.table_trigger_summary s ORDER BY s.name;
$$;
GRANT EXECUTE ON FUNCTION webhooks.table_trigger_list() TO webhooks_admin, webhooks_tenant_admin;

-- `triggers show NAME`: one table trigger; refused (SQLSTATE P0002) when the caller sees none of
-- that name.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_show(p_name text) RETURNS SETOF webhooks.table_trigger_summary
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM webhooks.table_trigger_summary s WHERE s.name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table trigger %: no such table trigger', p_name USING ERRCODE = 'no_data_found';
    END IF;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.table_trigger_show(text) TO webhooks_admin, webhooks_tenant_admin;

-- The registration of that name, locked (FOR UPDATE) or not; refused (P0002) when there is none.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_named(p_name text, p_lock boolean DEFAULT false)
RETURNS webhooks.table_triggers
LANGUAGE plpgsql
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_trigger webhooks.table_triggers;
BEGIN
    IF p_lock THEN
        SELECT * INTO v_trigger FROM webhooks.table_triggers t WHERE t.name = p_name FOR UPDATE;
    ELSE
        SELECT * INTO v_trigger FROM webhooks.table_triggers t WHERE t.name = p_name;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table trigger %: no such table trigger', p_name USING ERRCODE = 'no_data_found';
    END IF;
    RETURN v_trigger;
END;
$$;

-- `triggers disable NAME` / `triggers enable NAME`: whether its PostgreSQL triggers queue anything.
-- Its triggers stay on the table (dropping or disabling them there is the table owner's), and a
-- disabled one costs the writer one look at its registration per statement. Answers whether the
-- setting changed.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_set_enabled(p_name text, p_enabled boolean) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
BEGIN
    PERFORM webhooks.table_trigger_named(p_name, true);
    UPDATE webhooks.table_triggers t SET enabled = p_enabled, updated_at = now()
    WHERE t.name = p_name AND t.enabled <> p_enabled;
    RETURN FOUND;
END;
$$;

CREATE OR REPLACE FUNCTION webhooks.table_trigger_disable(p_name text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT webhooks.table_trigger_set_enabled(p_name, false);
$$;

CREATE OR REPLACE FUNCTION webhooks.table_trigger_enable(p_name text) RETURNS boolean
LANGUAGE sql
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT webhooks.table_trigger_set_enabled(p_name, true);
$$;
GRANT EXECUTE ON FUNCTION webhooks.table_trigger_set_enabled(text, boolean), webhooks.table_trigger_disable(text),
    webhooks.table_trigger_enable(text) TO webhooks_admin;

-- The registration goes, as the schema owner; a running backfill of it is cancelled. Answers its
-- table (NULL when the table is gone) and ops, for table_trigger_drop() to take its triggers off.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_unregister(p_name text, OUT table_oid oid, OUT ops text[])
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_trigger webhooks.table_triggers := webhooks.table_trigger_named(p_name, true);
BEGIN
    UPDATE webhooks.api_operations o
    SET status = 'cancelled', cancelled_by = format('table trigger %s dropped by %s', p_name, webhooks.acting_role()),
        updated_at = now(), finished_at = now()
    WHERE o.kind = 'trigger_backfill' AND o.status = 'running' AND (o.filter ->> 'trigger_id')::bigint = v_trigger.id;
    DELETE FROM webhooks.table_triggers t WHERE t.id = v_trigger.id;
    table_oid := (SELECT c.oid FROM pg_class c WHERE c.oid = v_trigger.table_oid);
    ops := v_trigger.ops;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.table_trigger_unregister(text) TO webhooks_admin;

-- `triggers drop NAME`: the registration goes, and its PostgreSQL triggers with it when the caller
-- owns the table (this runs as its caller: only a table's owner may drop its triggers). Otherwise
-- they stay, queue nothing, and a NOTICE says what the owner should run. Answers whether they went.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_drop(p_name text) RETURNS boolean
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_gone record := webhooks.table_trigger_unregister(p_name);
    v_op   text;
BEGIN
    IF v_gone.table_oid IS NULL THEN
        RETURN true;
    END IF;
    IF NOT pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = v_gone.table_oid), 'USAGE') THEN
        RAISE NOTICE 'table trigger % is dropped; its PostgreSQL triggers stay on % (they queue nothing) until '
                     'the table''s owner drops them: %', p_name, v_gone.table_oid::regclass,
                     (SELECT string_agg(format('DROP TRIGGER %I ON %s;', 'webhooks_' || p_name || '_' || o,
                                               v_gone.table_oid::regclass), ' ')
                      FROM unnest(v_gone.ops) o);
        RETURN false;
    END IF;
    FOREACH v_op IN ARRAY v_gone.ops LOOP
        EXECUTE format('DROP TRIGGER IF EXISTS %I ON %s', 'webhooks_' || p_name || '_' || v_op, v_gone.table_oid::regclass);
    END LOOP;
    RETURN true;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.table_trigger_drop(text) TO webhooks_admin;

-- Backfill and invoke send a table's rows: refused (42501) unless the role that asks may read them
-- itself (the TRIGGER privilege that let it add the trigger is no right to read what is there).
CREATE OR REPLACE FUNCTION webhooks.table_trigger_caller_reads(p_trigger webhooks.table_triggers) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_role name := webhooks.acting_role();
BEGIN
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = p_trigger.table_oid)
       AND NOT has_table_privilege(v_role, p_trigger.table_oid, 'SELECT') THEN
        RAISE EXCEPTION 'permission denied to send the rows of %: the role % may not SELECT from it',
                        p_trigger.table_oid::regclass, v_role
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('The table''s owner can grant it: GRANT SELECT ON %s TO %I',
                                p_trigger.table_oid::regclass, v_role);
    END IF;
END;
$$;

-- The schema owner reads the table for a backfill or an invoke: refused, saying what to grant, when
-- it may not. Answers the table as regclass text.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_readable(p_trigger webhooks.table_triggers) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_schema oid := (SELECT c.relnamespace FROM pg_class c WHERE c.oid = p_trigger.table_oid);
BEGIN
    IF v_schema IS NULL THEN
        RAISE EXCEPTION 'table trigger %: its table %.% was dropped', p_trigger.name, p_trigger.table_schema,
                        p_trigger.table_name
            USING ERRCODE = 'undefined_table';
    END IF;
    IF NOT (has_schema_privilege(v_schema, 'USAGE') AND has_table_privilege(p_trigger.table_oid, 'SELECT')) THEN
        RAISE EXCEPTION 'table trigger %: the webhooks schema''s owner (%) may not read %', p_trigger.name,
                        current_user, p_trigger.table_oid::regclass
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Backfill and invoke read the table as that role: GRANT USAGE ON SCHEMA %I TO %I; '
                                'GRANT SELECT ON %s TO %I', v_schema::regnamespace, current_user,
                                p_trigger.table_oid::regclass, current_user);
    END IF;
    RETURN p_trigger.table_oid::regclass::text;
END;
$$;

-- What a backfill or an invoke reads the table as: ONLY the table itself when it is a plain one (an
-- inheritance child's rows are not its rows, and its triggers do not see them), a partitioned table
-- with its partitions (it holds no rows of its own).
CREATE OR REPLACE FUNCTION webhooks.table_trigger_from(p_trigger webhooks.table_triggers) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT CASE WHEN c.relkind = 'p' THEN '' ELSE 'ONLY ' END || c.oid::regclass::text
    FROM pg_class c WHERE c.oid = p_trigger.table_oid;
$$;

-- Refused (42501) when the key's columns, or these, reach a type with a cast of the application's:
-- a backfill or an invoke parses SQL over them as the schema owner (table_columns_casts()).
CREATE OR REPLACE FUNCTION webhooks.table_trigger_no_casts(p_trigger webhooks.table_triggers, p_columns smallint[])
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_casts text := webhooks.table_columns_casts(p_trigger.table_oid, p_trigger.key_columns || coalesce(p_columns, '{}'));
BEGIN
    IF v_casts IS NOT NULL THEN
        RAISE EXCEPTION 'table trigger %: its key or condition reads a column whose type has a cast of the '
                        'application''s (%), which would run as the webhooks schema''s owner', p_trigger.name, v_casts
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Drop the cast, or add the trigger again without a condition on that column.';
    END IF;
END;
$$;

-- The primary key's columns now (of the range variable t), the SQL that casts key texts to their
-- types ($1[i]: the i-th key text) for a keyset comparison, and the SQL of their texts. A domain is read as its base type, whose input function is
-- PostgreSQL's (a domain's check could run the application's code as the owner).
CREATE OR REPLACE FUNCTION webhooks.table_trigger_key_sql(p_trigger webhooks.table_triggers,
                                                          OUT columns text, OUT keys text, OUT texts text,
                                                          OUT count integer)
LANGUAGE sql STABLE
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
    SELECT string_agg(format('t.%I', a.attname), ', ' ORDER BY k.n),
           string_agg(format('($1[%s])::%s', k.n, format_type(webhooks.base_type(a.atttypid), NULL)), ', ' ORDER BY k.n),
           -- a key's text as its type's output function writes it (a cast to text could be the application's)
           string_agg(format('format(''%%s'', t.%I)', a.attname), ', ' ORDER BY k.n),
           count(a.attnum)::integer
    FROM unnest(p_trigger.key_columns) WITH ORDINALITY AS k(attnum, n)
    JOIN pg_attribute a ON a.attrelid = p_trigger.table_oid AND a.attnum = k.attnum AND NOT a.attisdropped;
$$;

-- `triggers backfill NAME`: existing rows (all, or those meeting p_where, and the trigger's own
-- condition) queued as op backfill, p_rate rows a second (NULL: as fast as the steps go), as a bulk
-- operation the API's runner steps (table_trigger_backfill_step()). As its caller, which parses the
-- condition (table_condition_check()); the operation is started by table_trigger_backfill_start().
-- Answers the operation's id.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_backfill(p_name text, p_where text DEFAULT NULL,
                                                           p_rate double precision DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_check oid;
    v_id    bigint;
BEGIN
    IF p_where IS NOT NULL THEN
        v_check := webhooks.table_condition_check(
            (SELECT s.table_name FROM webhooks.table_trigger_show(p_name) s)::regclass, p_where);
    END IF;
    v_id := webhooks.table_trigger_backfill_start(p_name, p_where, v_check, p_rate);
    IF v_check IS NOT NULL THEN
        DROP TABLE pg_temp.webhooks_condition_check;
    END IF;
    RETURN v_id;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.table_trigger_backfill(text, text, double precision) TO webhooks_admin;

CREATE OR REPLACE FUNCTION webhooks.table_trigger_backfill_start(p_name text, p_where text, p_where_check oid,
                                                                 p_rate double precision)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
AS $$
DECLARE
    v_trigger   webhooks.table_triggers := webhooks.table_trigger_named(p_name, true);
    v_condition record;
    v_running   bigint;
    v_id        bigint;
BEGIN
    PERFORM webhooks.table_trigger_readable(v_trigger);
    PERFORM webhooks.table_trigger_caller_reads(v_trigger);
    -- the bounds of worker/rules/pacing.py (NaN compares above every number: both ends are checked)
    IF p_rate IS NOT NULL AND NOT (p_rate >= 0.001 AND p_rate <= 100000) THEN
        RAISE EXCEPTION 'rate %: rows a second, from 0.001 to 100000', p_rate USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT o.id INTO v_running FROM webhooks.api_operations o
    WHERE o.kind = 'trigger_backfill' AND o.status = 'running' AND (o.filter ->> 'trigger_id')::bigint = v_trigger.id;
    IF v_running IS NOT NULL THEN
        RAISE EXCEPTION 'table trigger %: backfill % is running; cancel it first or wait for it', p_name, v_running
            USING ERRCODE = 'object_in_use';
    END IF;
    SELECT r.condition, r.columns, r.names INTO v_condition
    FROM webhooks.table_condition_read(v_trigger.table_oid, p_where_check, p_where) r WHERE p_where IS NOT NULL;
    INSERT INTO webhooks.api_operations (kind, filter, rate, requested_by, tenant_id, total_estimate)
    VALUES ('trigger_backfill',
            jsonb_strip_nulls(jsonb_build_object('trigger_id', v_trigger.id, 'trigger', v_trigger.name,
                                                 'where', v_condition.condition, 'where_columns', v_condition.columns,
                                                 'where_names', v_condition.names)),
            p_rate, webhooks.acting_role(), NULL,
            (SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c WHERE c.oid = v_trigger.table_oid))
    RETURNING id INTO v_id;
    RETURN v_id;
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.table_trigger_backfill_start(text, text, oid, double precision) TO webhooks_admin;

-- One step of a running backfill (api_replay_step() hands a trigger_backfill here): the next
-- p_limit rows by primary key after where it got to, those meeting its conditions queued as op
-- backfill, and where it got to recorded, in one transaction: a step that is killed leaves it where
-- it was, and a page read twice queues nothing twice (the event ids derive from the operation and
-- the row). Done when a page comes back short. No row when it is not running, another session is
-- stepping it, or its next step is not due.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_backfill_step(p_operation_id bigint, p_limit integer)
RETURNS TABLE (status text, processed bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_op      webhooks.api_operations;
    v_trigger webhooks.table_triggers;
    v_table   text;
    v_key     record;
    v_json    text;
    v_when    text;
    v_where   text;
    v_rows    jsonb[];
    v_pass    boolean[];
    v_last    jsonb;
    v_made    integer := 0;
    v_queued  integer := 0;
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'table_trigger_backfill_step: p_limit must be 1 to 10000, got %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO v_op FROM webhooks.api_operations o
    WHERE o.id = p_operation_id AND o.kind = 'trigger_backfill' AND o.status = 'running' AND o.next_step_at <= now()
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO v_trigger FROM webhooks.table_triggers t WHERE t.id = (v_op.filter ->> 'trigger_id')::bigint;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'table trigger % was dropped', v_op.filter ->> 'trigger' USING ERRCODE = 'undefined_object';
    END IF;
    v_table := webhooks.table_trigger_readable(v_trigger);
    v_key := webhooks.table_trigger_key_sql(v_trigger);
    IF v_key.count < cardinality(v_trigger.key_columns) THEN
        RAISE EXCEPTION 'table trigger %: a column of its key was dropped', v_trigger.name USING ERRCODE = 'undefined_column';
    END IF;
    PERFORM webhooks.table_trigger_no_casts(v_trigger, v_trigger.when_columns
                                            || ARRAY(SELECT jsonb_array_elements_text(v_op.filter -> 'where_columns'))::smallint[]);
    v_json := coalesce(webhooks.table_row_json_sql(v_trigger.table_oid, 't'), 'to_jsonb(t.*)');
    IF v_trigger.when_condition IS NOT NULL THEN
        v_when := webhooks.table_condition_sql(v_trigger.table_oid, v_trigger.when_condition, v_trigger.when_columns,
                                               v_trigger.when_names, 't');
        IF v_when IS NULL THEN
            RAISE EXCEPTION 'table trigger %: its when condition reads a column that was dropped', v_trigger.name
                USING ERRCODE = 'undefined_column';
        END IF;
    END IF;
    IF v_op.filter ? 'where' THEN
        v_where := webhooks.table_condition_sql(
            v_trigger.table_oid, v_op.filter ->> 'where',
            ARRAY(SELECT jsonb_array_elements_text(v_op.filter -> 'where_columns'))::smallint[],
            ARRAY(SELECT jsonb_array_elements_text(v_op.filter -> 'where_names')), 't');
        IF v_where IS NULL THEN
            RAISE EXCEPTION 'backfill %: its where condition reads a column that was dropped', v_op.id
                USING ERRCODE = 'undefined_column';
        END IF;
    END IF;
    -- the page: every row read (its place is the next page's start), and which of them to queue
    BEGIN
    EXECUTE format('SELECT array_agg(p.rw ORDER BY p.n), array_agg(p.pass ORDER BY p.n), '
                   '       (array_agg(p.last ORDER BY p.n DESC))[1] '
                   'FROM (SELECT row_number() OVER (ORDER BY %s) AS n, %s AS rw, %s AND %s AS pass, '
                   '             to_jsonb(ARRAY[%s]) AS last '
                   '      FROM %s t WHERE %s ORDER BY %s LIMIT %s) p',
                   v_key.columns, v_json, coalesce(v_when, 'true'), coalesce(v_where, 'true'), v_key.texts,
                   webhooks.table_trigger_from(v_trigger),
                   CASE WHEN v_op.position IS NULL THEN 'true' ELSE format('(%s) > (%s)', v_key.columns, v_key.keys) END,
                   v_key.columns, p_limit)
    INTO v_rows, v_pass, v_last
    USING ARRAY(SELECT jsonb_array_elements_text(v_op.position));
    EXCEPTION WHEN data_exception THEN
        -- only the SQLSTATE: PostgreSQL's message may quote a value of an excluded column, and the
        -- operation's error is read by anyone who may list operations
        RAISE EXCEPTION 'backfill %: its where or when condition failed on a row (SQLSTATE %)', v_op.id, SQLSTATE
            USING ERRCODE = SQLSTATE;
    END;
    IF coalesce(cardinality(v_rows), 0) > 0 THEN
        v_rows := ARRAY(SELECT r.rw FROM unnest(v_rows, v_pass) AS r(rw, pass) WHERE r.pass);
        v_queued := coalesce(cardinality(v_rows), 0);
        IF v_queued > 0 THEN
            v_made := webhooks.table_trigger_queue(v_trigger, 'backfill', v_rows, NULL, 'backfill:' || v_op.id,
                                                   (SELECT n.nspname FROM pg_class c JOIN pg_namespace n
                                                    ON n.oid = c.relnamespace WHERE c.oid = v_trigger.table_oid),
                                                   (SELECT c.relname FROM pg_class c WHERE c.oid = v_trigger.table_oid));
        END IF;
    END IF;
    UPDATE webhooks.api_operations o
    SET processed = o.processed + v_queued, scanned = o.scanned + coalesce(cardinality(v_pass), 0),
        position = coalesce(v_last, o.position), updated_at = now(),
        next_step_at = CASE WHEN o.rate IS NULL THEN now() ELSE now() + make_interval(secs => p_limit / o.rate) END,
        status = CASE WHEN coalesce(cardinality(v_pass), 0) < p_limit THEN 'done' ELSE 'running' END,
        finished_at = CASE WHEN coalesce(cardinality(v_pass), 0) < p_limit THEN now() END
    WHERE o.id = p_operation_id
    RETURNING o.status, o.processed INTO status, processed;
    RETURN NEXT;
END;
$$;

-- `triggers invoke NAME --key KEY`: one row queued now as op manual, whatever the trigger's
-- condition (an operator asked for it). p_key is the primary key's value as text, or, for a key of
-- several columns, a JSON array of them in the key's order. Refused (P0002) when there is no such
-- row. Answers the deliveries it made.
CREATE OR REPLACE FUNCTION webhooks.table_trigger_invoke(p_name text, p_key text) RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, webhooks, pg_temp
SET jit = off
AS $$
DECLARE
    v_trigger webhooks.table_triggers := webhooks.table_trigger_named(p_name);
    v_table   text := webhooks.table_trigger_readable(v_trigger);
    v_key     record := webhooks.table_trigger_key_sql(v_trigger);
    v_keys    text[];
    v_row     jsonb;
BEGIN
    PERFORM webhooks.table_trigger_caller_reads(v_trigger);
    PERFORM webhooks.table_trigger_no_casts(v_trigger, '{}');
    IF cardinality(v_trigger.key_columns) = 1 THEN
        v_keys := ARRAY[p_key];
    ELSE
        BEGIN
            v_keys := ARRAY(SELECT jsonb_array_elements_text(p_key::jsonb));
        EXCEPTION WHEN invalid_text_representation OR invalid_parameter_value THEN
            v_keys := NULL;
        END;
    END IF;
    IF p_key IS NULL OR cardinality(v_keys) IS DISTINCT FROM v_key.count THEN
        RAISE EXCEPTION 'key %: % has a key of % columns (%)%', coalesce(to_jsonb(p_key)::text, 'null'), v_table,
                        v_key.count, replace(v_key.columns, 't.', ''),
                        CASE WHEN v_key.count > 1 THEN ': give a JSON array of their values' ELSE '' END
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    BEGIN
        EXECUTE format('SELECT %s FROM %s t WHERE (%s) = (%s)',
                       coalesce(webhooks.table_row_json_sql(v_trigger.table_oid, 't'), 'to_jsonb(t.*)'),
                       webhooks.table_trigger_from(v_trigger),
                       v_key.columns, v_key.keys)
        INTO v_row USING v_keys;
    EXCEPTION WHEN invalid_text_representation OR invalid_datetime_format OR numeric_value_out_of_range
                   OR datetime_field_overflow THEN
        RAISE EXCEPTION 'key %: %', to_jsonb(p_key), SQLERRM USING ERRCODE = 'invalid_parameter_value';
    END;
    IF v_row IS NULL THEN
        RAISE EXCEPTION 'table trigger %: % has no row with key %', p_name, v_table, to_jsonb(p_key)
            USING ERRCODE = 'no_data_found';
    END IF;
    RETURN webhooks.table_trigger_queue(v_trigger, 'manual', ARRAY[v_row], NULL,
                                        'manual:' || pg_current_xact_id()::text,
                                        (SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                                         WHERE c.oid = v_trigger.table_oid),
                                        (SELECT c.relname FROM pg_class c WHERE c.oid = v_trigger.table_oid));
END;
$$;
GRANT EXECUTE ON FUNCTION webhooks.table_trigger_invoke(text, text) TO webhooks_admin;
