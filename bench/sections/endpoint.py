"""Section `endpoint`, one endpoint's ceiling: a fast receiver, one worker, production limits except
`max_in_flight`."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from bench.drain import drain, drain_summary
from bench.section import Context, Section, Target, get, log, target


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--endpoint-rows", type=int, default=3000,
                       help="rows for each one-endpoint drain (3,000)")


def run(ctx: Context) -> dict[str, Any]:
    """One endpoint's ceiling: a fast receiver, one worker, production limits except
    `max_in_flight`, which this varies: the production default 10, then 100 and 1,000."""
    out: dict[str, Any] = {"rows": ctx.args.endpoint_rows}
    for cap in (10, 100, 1000):
        log(f"endpoint: max_in_flight {cap}")
        r = drain(ctx, "bench_endpoint", 1, ctx.args.endpoint_rows, ctx.settings,
                  limits={"max_in_flight": cap})
        out[f"max_in_flight_{cap}"] = drain_summary(r)
    return out


def targets(results: dict[str, Any], _args: argparse.Namespace) -> Iterator[Target]:
    for cap in (10, 100, 1000):
        one_endpoint = get(results, "endpoint", f"max_in_flight_{cap}")
        if one_endpoint is not None:
            yield target(f"one endpoint, fast receiver, max_in_flight {cap}",
                         f"{one_endpoint['per_second'] or 0:,.0f}/s", "(no target)", None)


SECTION = Section("endpoint", run, options=options, targets=targets, quick={"endpoint_rows": 200})
