"""What the console's pages read and change, each through worker.store: the calls the CLI and the API
make, gathered per page."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from worker.console import chart
from worker.rules import event_types
from worker.rules.coalescing import digest_label
from worker.store import deliveries, endpoints, operations, tenants
from worker.store import event_types as catalogue
from worker.store.database import Conn

CHART_HOURS = 6
CHART_BUCKET = timedelta(minutes=10)
# Pages list at most this many rows: the console is for looking, bulk work has the API and CLI.
PAGE_ROWS = 200
# An endpoint's page shows its latest deliveries, attempts and changes, this many of each.
RECENT_ROWS = 20
# Failed attempts: what the chart draws in red (deferrals and state changes are neither).
FAILED_OUTCOMES = ("retry", "dead_letter", "lease_expired")
# A payload shown whole up to this size; a larger one is cut, saying so.
PAYLOAD_SHOWN_CHARS = 64 * 1024
# The event-type list names this many of the subscriptions matching each type; its page names them all.
SHOWN_SUBSCRIPTIONS = 5
# The console's lists of endpoint changes show this many.
RECENT_EVENTS = 20


async def overview(conn: Conn) -> dict[str, Any]:
    queue = await deliveries.queue_overview(conn)
    held_back = await deliveries.held_back(conn)
    return {
        "queue": queue,
        "oldest_due_seconds": max((r["oldest_due_age_seconds"] or 0.0 for r in queue), default=0.0),
        "held_back": held_back,
        "endpoints": await endpoints.summaries(conn, PAGE_ROWS),
        "chart": await attempts_chart(conn),
    }


async def endpoint_page(conn: Conn, endpoint_id: int) -> dict[str, Any] | None:
    """An endpoint's page: its settings in the service's one shape, its subscriptions that match no
    current event type, health and circuit, its latest deliveries and attempts, its changes; None when
    the caller does not see it."""
    endpoint = await endpoints.read(conn, endpoint_id)
    if endpoint is None:
        return None
    shown = await deliveries.of_endpoint(conn, endpoint_id, RECENT_ROWS)
    attempts = await deliveries.recent_attempts(conn, endpoint_id, RECENT_ROWS)
    events = await endpoints.events(conn, endpoint_id, RECENT_ROWS)
    # its subscriptions no current catalogued type matches, as `endpoints show` finds them
    unmatched = event_types.unmatched_of_endpoint(await catalogue.unmatched_subscriptions(conn), endpoint_id)
    return {"endpoint": endpoint, "deliveries": shown, "attempts": attempts, "events": events,
            "unmatched": unmatched}


async def attempts_chart(conn: Conn) -> chart.Chart:
    now, counts = await deliveries.attempt_counts(conn, CHART_BUCKET, FAILED_OUTCOMES,
                                                  timedelta(hours=CHART_HOURS) + CHART_BUCKET)
    return chart.build(counts, now, CHART_HOURS, CHART_BUCKET)


async def dead_letters(conn: Conn, filters: dict[str, Any]) -> list[dict[str, Any]]:
    return await deliveries.dead_letters_shown(conn, filters, PAGE_ROWS)


async def search_deliveries(conn: Conn, found: dict[str, Any], endpoint_id: int | None
                            ) -> list[dict[str, Any]]:
    """Deliveries matching the search (any status), newest first."""
    return await deliveries.search(conn, found, endpoint_id, PAGE_ROWS)


async def filter_choices(conn: Conn) -> dict[str, list[Any]]:
    return await endpoints.names(conn, PAGE_ROWS)


async def endpoint_ref(conn: Conn, ref: str) -> int | str | None:
    """The endpoint a name, an id or tenant/name names, as the CLI reads ENDPOINT (None: none the
    caller sees); for a name held in more than one tenant, why it names none (asking for the id or
    tenant/name)."""
    import psycopg

    try:
        return await endpoints.endpoint_ref(conn, ref)
    except psycopg.errors.TooManyRows as exc:
        return str(exc.diag.message_primary)


async def delivery(conn: Conn, delivery_id: int) -> dict[str, Any] | None:
    row = await deliveries.delivery_with_history(conn, delivery_id)
    if row is None:
        return None
    for attempt in row["history"]:
        attempt["digest"] = None if attempt["digest_id"] is None else digest_label(attempt["digest_id"])
    return row


async def start_replay(conn: Conn, filters: dict[str, Any], requested_by: str) -> int:
    """A bulk replay of the dead letters matching `filters`, started as the API starts one."""
    return await operations.start_replay(conn, filters, None, None, requested_by)


async def endpoint_events(conn: Conn) -> list[dict[str, Any]]:
    return await endpoints.latest_events(conn, RECENT_EVENTS)


def payload_text(payload: Any) -> tuple[str, bool]:
    """The payload as indented JSON, and whether it was cut to PAYLOAD_SHOWN_CHARS."""
    text = json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True)
    if len(text) > PAYLOAD_SHOWN_CHARS:
        return text[:PAYLOAD_SHOWN_CHARS], True
    return text, False


async def operations_page(conn: Conn) -> list[dict[str, Any]]:
    """The bulk replays started over the API, newest first, each with the name of the endpoint its
    filter names, when the caller sees it."""
    return await operations.latest_with_endpoints(conn, PAGE_ROWS)


# The tenant lookups the pages make, as the store answers them.
tenant_id = tenants.tenant_id
tenant_name = tenants.tenant_name
replay = deliveries.replay_many
endpoint_rows = deliveries.endpoint_rows
endpoint_action = endpoints.act
ENDPOINT_ACTIONS = endpoints.ENDPOINT_ACTIONS
delete_endpoint = endpoints.delete
cancel_operation = operations.cancel
