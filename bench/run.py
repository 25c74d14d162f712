"""The webhook-worker benchmark: every figure in one run on one machine.

    .venv/bin/python -m bench.run            # full run (about 20-30 minutes on 2 cores)
    .venv/bin/python -m bench.run --quick    # small sizes: checks the harness itself in about 2 minutes

Prints a table with each target next to its figure (PASS/MISS) and writes the JSON next to the
worker and sink logs under bench/results/<timestamp>/. See bench/README.md for what each section
measures and how.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import signal
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import Cluster, Sink, WorkerSettings, machine_load
from bench.localworker import ROOT
from bench.section import Context, Figures, Section, Target, log

# The sections, each a module of bench/sections declaring SECTION, in the order of --help and of the
# printed table. A new section is a new module and its name here.
SECTION_MODULES = ("http", "db", "e2e", "latency", "backlog", "producer", "many", "naive", "endpoint", "slow",
                   "features", "sweep", "storm", "tenants", "retention", "reclaim", "spread", "pgqueuer",
                   "api", "restart", "messages", "triggers")


def registry() -> dict[str, Section]:
    sections = {}
    for name in SECTION_MODULES:
        section: Section = importlib.import_module(f"bench.sections.{name}").SECTION
        if section.name != name:
            raise RuntimeError(f"bench/sections/{name}.py declares section {section.name!r}")
        sections[name] = section
    return sections


SECTIONS = registry()


def targets(results: dict[str, Any], args: argparse.Namespace) -> list[Target]:
    """Every section's targets, for the sections that ran (a target may also read another's figures)."""
    return [row for name, section in SECTIONS.items() if isinstance(results.get(name), dict)
            for row in section.targets(results, args)]


def figures_table(results: dict[str, Any]) -> Figures:
    return [line for name, section in SECTIONS.items() if isinstance(results.get(name), dict)
            for line in section.figures(results[name])]


def print_report(results: dict[str, Any], json_path: Path) -> None:
    print()
    print(
        f"webhook-worker benchmark — {results['machine']['cpu']} × {results['machine']['nproc']}, "
        f"PostgreSQL {results['machine']['postgres']}, Python {results['machine']['python']}"
    )
    print(f"loops: worker and HTTP ceiling {results['loops']['worker']}; sink {results['loops']['sink']}")
    print(f"settings: {results['settings']}")
    print()
    lines = figures_table(results)
    width = max((len(a) for a, _ in lines), default=10)
    for a, b in lines:
        print(f"{a:<{width}}  {b}")
    print()
    rows = results["targets"]
    if rows:
        w1 = max(len(r["target"]) for r in rows)
        w2 = max(len(str(r["figure"])) for r in rows)
        for r in rows:
            print(f"{r['result']:<5} {r['target']:<{w1}}  {r['figure']!s:<{w2}}  (target {r['goal']})")
    for name, error in results.get("errors", {}).items():
        print(f"ERROR in {name}: {error.splitlines()[-1] if error else ''}")
    print()
    print(f"JSON: {json_path}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = [name for name, section in SECTIONS.items() if section.default]
    others = [name for name in SECTIONS if name not in defaults]
    p.add_argument("--quick", action="store_true", help="small sizes, to check the harness (about 2 minutes)")
    p.add_argument(
        "--only",
        default=",".join(defaults),
        help=f"comma-separated sections, of {', '.join(SECTIONS)} (default: all but "
             f"{', '.join(others[:-1])} and {others[-1]})",
    )
    # what several sections use
    p.add_argument("--rows", type=int, default=50_000, help="backlog for e2e, db ceiling and naive (50,000)")
    p.add_argument(
        "--endpoints", type=int, default=1, help="endpoints the e2e/backlog rows are spread over (1)"
    )
    p.add_argument("--drain-timeout", type=float, default=1200.0, help="time cap for any one drain (1200 s)")
    p.add_argument("--concurrency", type=int, help="worker.concurrency (production default 100)")
    p.add_argument(
        "--claim-batch-size", type=int, help="delivery.claim_batch_size (default from database: 100)"
    )
    p.add_argument(
        "--finish-batch-size", type=int, help="delivery.finish_batch_size (default from database: 100)"
    )
    p.add_argument("--pool-max-size", type=int, help="database.pool_max_size (production default 4)")
    p.add_argument("--keep-databases", action="store_true")
    p.add_argument(
        "--no-analyze",
        action="store_true",
        help="do not ANALYZE the queue after a bulk preload (leave it to autovacuum)",
    )
    p.add_argument(
        "--track-nested",
        action="store_true",
        help="pg_stat_statements.track=all: also report statements inside the SQL functions (adds overhead)",
    )
    p.add_argument("--out", type=Path, help="results directory (default bench/results/<timestamp>)")
    for name, section in SECTIONS.items():
        section.options(p.add_argument_group(f"section {name}"))
    args = p.parse_args(argv)
    if args.quick:
        args.rows = 1000
        args.drain_timeout = min(args.drain_timeout, 120.0)
        for section in SECTIONS.values():
            for option, value in section.quick.items():
                setattr(args, option, value)
    unknown = set(args.only.split(",")) - set(SECTIONS)
    if unknown:
        p.error(f"--only: unknown sections {sorted(unknown)}")
    return args


def machine() -> dict[str, Any]:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def _interrupted(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM, and SIGINT even when a background shell left it ignored, unwind through the finally
    # blocks: workers stopped, sink stopped, the throwaway cluster removed.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    out_dir = args.out or ROOT / "bench" / "results" / datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = WorkerSettings(
        concurrency=args.concurrency,
        claim_batch_size=args.claim_batch_size,
        finish_batch_size=args.finish_batch_size,
        pool_max_size=args.pool_max_size,
    )
    results: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(),
        "quick": args.quick,
        "machine": machine(),
        "settings": settings.describe(),
        "errors": {},
    }
    cluster = Cluster(track_nested=args.track_nested)
    log(f"starting PostgreSQL and the sink; results in {out_dir}")
    cluster.start()
    results["machine"]["postgres"] = cluster.version()
    sink = Sink(out_dir)
    results["loops"] = {
        "worker": "worker.event_loop auto (asyncio unless worker.runtime.AUTO_PREFERS_UVLOOP); the e2e"
                  " section also runs it on uvloop",
        "sink": sink.loop,
    }
    ctx = Context(args, cluster, sink, out_dir, settings, results)
    json_path = out_dir / "results.json"
    try:
        for name in args.only.split(","):
            log(f"section {name}")
            started = time.monotonic()
            try:
                results[name] = SECTIONS[name].run(ctx)
            except Exception:  # noqa: BLE001 - one failed section must not lose the others
                results["errors"][name] = traceback.format_exc()
                log(f"section {name} failed:\n{results['errors'][name]}")
            results.setdefault("section_seconds", {})[name] = round(time.monotonic() - started, 1)
            # the machine is shared: the load after each section tells whether others ran meanwhile
            results["machine"].setdefault("load_average", {})[name] = machine_load()
            json_path.write_text(json.dumps(results, indent=2, default=str))
    finally:
        sink.stop()
        cluster.stop()
    results["targets"] = targets(results, args)
    results["finished_at"] = datetime.now(UTC).isoformat()
    json_path.write_text(json.dumps(results, indent=2, default=str))
    print_report(results, json_path)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
