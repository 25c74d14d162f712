"""Section `tenants` (not in the default run): fairness between tenants, how long a small tenant's rows
take under a big tenant's load, with and without tenants."""

from __future__ import annotations

import json
import time
from typing import Any

from bench.common import payload_json, preload, register_endpoints, spawn_worker
from bench.localworker import LOOPBACK, query, wait_started
from bench.section import Context, Section


def run(ctx: Context) -> dict[str, Any]:
    """Fairness between tenants: a big tenant with 50 endpoints and 50,000 rows queued, a
    small one with 1 endpoint and 500 rows queued after them; how long the small one's rows take to be
    delivered, alone, under the big one's load, and under that load with all 51 endpoints in one
    tenant (what a deployment without tenants gives an endpoint: 1/51 of each claim)."""
    big_endpoints, big_rows, small_rows = (10, 2000, 50) if ctx.args.quick else (50, 50_000, 500)
    out: dict[str, Any] = {"big_endpoints": big_endpoints, "big_rows": big_rows, "small_rows": small_rows}
    for label, load, separate in (("alone", False, True), ("loaded", True, True),
                                  ("loaded_one_tenant", True, False)):
        name = f"bench_tenants_{label}"
        dsn = ctx.cluster.new_database(name)
        big = register_endpoints(dsn, [ctx.sink.url(f"/ok/big-{i}") for i in range(big_endpoints)],
                                 prefix="big", max_in_flight=100)
        [small] = register_endpoints(dsn, [ctx.sink.url("/ok/small")], prefix="small", max_in_flight=100)
        if separate:
            # the sink is on loopback: granted to both, as an operator grants a tenant a network
            grant = json.dumps({"allow_networks": LOOPBACK})
            query(dsn, "SELECT webhooks.register_tenant('big', %s), webhooks.register_tenant('small', %s)",
                  (grant, grant))
            query(dsn, "UPDATE webhooks.endpoints SET tenant_id = webhooks.tenant_id('big')"
                         " WHERE id = ANY(%s)", (big,))
            query(dsn, "UPDATE webhooks.endpoints SET tenant_id = webhooks.tenant_id('small')"
                         " WHERE id = %s", (small,))
        if load:
            preload(dsn, big, big_rows)
        ctx.sink.reset()
        [proc] = [spawn_worker(dsn, ctx.workdir, f"tenants-{label}", ctx.settings)]
        try:
            wait_started([proc])
            if load:  # the big tenant's backlog is being drained when the small one's rows arrive
                deadline = time.monotonic() + 60
                while ctx.sink.stats()["count"] < 1000 and time.monotonic() < deadline:
                    time.sleep(0.05)
            started = time.monotonic()
            query(dsn, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
                         " SELECT %s, 'alert.created', %s::jsonb FROM generate_series(1, %s)",
                    (small, payload_json(0), small_rows))
            done, big_done = 0, 0
            deadline = time.monotonic() + ctx.args.drain_timeout
            while time.monotonic() < deadline:
                [(done, big_done)] = query(
                    dsn, "SELECT count(*) FILTER (WHERE webhook_id = %s),"
                         " count(*) FILTER (WHERE webhook_id <> %s)"
                         " FROM webhooks.alert_delivery_queue WHERE status = 'delivered'", (small, small))
                if done >= small_rows:
                    break
                time.sleep(0.05)
            elapsed = time.monotonic() - started
        finally:
            proc.stop()
        out[label] = {"complete": done >= small_rows, "small_rows_delivered_s": round(elapsed, 2),
                      "big_rows_delivered_by_then": big_done}
        ctx.cluster.drop_database(name)
    return out


SECTION = Section("tenants", run, default=False)
