"""The schema `webhooks` as the catalogs describe it, in a form two databases can be compared by."""

from __future__ import annotations

from typing import Any

import psycopg

# Each query yields (key, description) rows of one kind of object. Daily log partitions are left out
# of every kind (their columns, indexes and the triggers cloned from the parent's): they are made for
# the dates a database happens to be built or migrated on. `partitions_missing_triggers()` checks those apart.
_QUERIES = {
    "relations": """
        SELECT c.relname, jsonb_build_object(
                   'kind', c.relkind, 'options', c.reloptions, 'owner', pg_get_userbyid(c.relowner),
                   'acl', coalesce(c.relacl, acldefault(CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END::"char",
                                                        c.relowner))::text[],
                   'partition', pg_get_expr(c.relpartbound, c.oid),
                   'partitioned_by', pg_get_partkeydef(c.oid),
                   'comment', obj_description(c.oid, 'pg_class'))
        FROM pg_class c
        WHERE c.relnamespace = 'webhooks'::regnamespace AND c.relname !~ '_\\d{8}(_.*)?$'""",
    "columns": """
        SELECT c.relname || '.' || a.attname, jsonb_build_object(
                   'position', row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
                   'type', format_type(a.atttypid, a.atttypmod), 'not_null', a.attnotnull,
                   'default', pg_get_expr(d.adbin, d.adrelid), 'identity', a.attidentity,
                   'generated', a.attgenerated, 'acl', a.attacl::text[], 'collation', a.attcollation)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'webhooks'::regnamespace AND c.relname !~ '_\\d{8}(_.*)?$'
          AND a.attnum > 0 AND NOT a.attisdropped""",
    "constraints": """
        SELECT c.relname || '.' || k.conname, jsonb_build_object(
                   'type', k.contype, 'definition', pg_get_constraintdef(k.oid), 'valid', k.convalidated,
                   'deferrable', k.condeferrable)
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE c.relnamespace = 'webhooks'::regnamespace AND c.relname !~ '_\\d{8}(_.*)?$'""",
    "indexes": """
        SELECT i.relname, to_jsonb(pg_get_indexdef(i.oid))
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        WHERE i.relnamespace = 'webhooks'::regnamespace AND i.relname !~ '_\\d{8}(_.*)?$'""",
    "functions": """
        SELECT p.oid::regprocedure::text, jsonb_build_object(
                   'definition', pg_get_functiondef(p.oid), 'config', p.proconfig,
                   'security_definer', p.prosecdef, 'owner', pg_get_userbyid(p.proowner),
                   'acl', coalesce(p.proacl, acldefault('f', p.proowner))::text[],
                   'comment', obj_description(p.oid, 'pg_proc'))
        FROM pg_proc p WHERE p.pronamespace = 'webhooks'::regnamespace""",
    "views": """
        SELECT c.relname, to_jsonb(pg_get_viewdef(c.oid))
        FROM pg_class c WHERE c.relnamespace = 'webhooks'::regnamespace AND c.relkind IN ('v', 'm')""",
    "triggers": """
        SELECT c.relname || '.' || t.tgname, jsonb_build_object(
                   'definition', pg_get_triggerdef(t.oid), 'enabled', t.tgenabled)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'webhooks'::regnamespace AND NOT t.tgisinternal
          AND c.relname !~ '_\\d{8}(_.*)?$'""",
    "types": """
        SELECT t.typname, jsonb_build_object('kind', t.typtype, 'owner', pg_get_userbyid(t.typowner),
                   'attributes', (SELECT jsonb_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
                                                    ORDER BY a.attnum)
                                  FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0))
        FROM pg_type t
        WHERE t.typnamespace = 'webhooks'::regnamespace AND t.typtype IN ('c', 'd', 'e')
          AND (t.typrelid = 0 OR (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c')""",
    "schema": """
        SELECT n.nspname, jsonb_build_object(
                   'owner', pg_get_userbyid(n.nspowner),
                   'acl', coalesce(n.nspacl, acldefault('n', n.nspowner))::text[])
        FROM pg_namespace n WHERE n.nspname = 'webhooks'""",
}


def partitions_missing_triggers(dsn: str) -> list[str]:
    """Each daily partition of a partitioned table that lacks one of its parent's row triggers, as
    `partition.trigger`: PostgreSQL clones them onto every partition, old or new."""
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute("""
            SELECT part.relname || '.' || t.tgname
            FROM pg_trigger t
            JOIN pg_class parent ON parent.oid = t.tgrelid AND parent.relkind = 'p'
            JOIN pg_inherits i ON i.inhparent = parent.oid
            JOIN pg_class part ON part.oid = i.inhrelid
            WHERE parent.relnamespace = 'webhooks'::regnamespace AND NOT t.tgisinternal
              AND NOT EXISTS (SELECT 1 FROM pg_trigger c WHERE c.tgrelid = part.oid AND c.tgparentid = t.oid)
            ORDER BY 1""").fetchall()]


def snapshot(dsn: str) -> dict[str, dict[str, Any]]:
    """Every object of the schema, by kind and name, with what defines it."""
    with psycopg.connect(dsn) as conn:
        return {kind: dict(conn.execute(sql).fetchall())  # type: ignore[arg-type]
                for kind, sql in _QUERIES.items()}


def differences(expected: dict[str, dict[str, Any]], actual: dict[str, dict[str, Any]]) -> list[str]:
    """What differs, one line per object: missing, left over, or defined otherwise."""
    found = []
    for kind in expected:
        want, have = expected[kind], actual[kind]
        for name in sorted(set(want) | set(have)):
            if name not in have:
                found.append(f"{kind} {name}: missing")
            elif name not in want:
                found.append(f"{kind} {name}: left over, defined nowhere in sql/")
            elif want[name] != have[name]:
                fields = want[name].keys() if isinstance(want[name], dict) else ["definition"]
                for field in fields:
                    w = want[name].get(field) if isinstance(want[name], dict) else want[name]
                    h = have[name].get(field) if isinstance(have[name], dict) else have[name]
                    if w != h:
                        found.append(f"{kind} {name}: {field} differs:\n  fresh:    {w!r}\n  migrated: {h!r}")
    return found
