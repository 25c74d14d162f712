"""What a benchmark section is: the context it runs in, its parts (options, run, figures, targets),
and the small helpers the sections share. bench/run.py drives them; each bench/sections/<name>.py
declares one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import Cluster, Sink, WorkerSettings

# Timed ratios with a target are the median of this many alternating runs of their sides.
MEDIAN_RUNS = 3


class Context:
    """What a section runs with: the parsed arguments, the cluster, the sink, the results directory,
    the worker settings, and the figures of the sections already run (for a section that builds on
    another's; none does today: the slow section measures its own fast-receiver rate)."""

    def __init__(
        self, args: argparse.Namespace, cluster: Cluster, sink: Sink, workdir: Path, settings: WorkerSettings,
        results: dict[str, Any] | None = None,
    ) -> None:
        self.results: dict[str, Any] = results if results is not None else {}
        self.args, self.cluster, self.sink, self.workdir, self.settings = (
            args,
            cluster,
            sink,
            workdir,
            settings,
        )


Figures = list[tuple[str, str]]
Target = dict[str, Any]


def _no_options(_parser: argparse._ArgumentGroup) -> None:
    return None


def _no_figures(_result: dict[str, Any]) -> Figures:
    return []


def _no_targets(_results: dict[str, Any], _args: argparse.Namespace) -> Iterable[Target]:
    return []


@dataclass(frozen=True)
class Section:
    """One section of the benchmark. `run` returns its JSON; `figures` turns that into lines of the
    printed table; `targets` reads every section's results (a target may compare two sections) and
    returns its rows of the PASS/MISS table. `options` adds its command-line options, `quick` is what
    --quick sets them to; `default`: whether it runs when --only is not given."""

    name: str
    run: Callable[[Context], dict[str, Any]]
    options: Callable[[argparse._ArgumentGroup], None] = _no_options
    figures: Callable[[dict[str, Any]], Figures] = _no_figures
    targets: Callable[[dict[str, Any], argparse.Namespace], Iterable[Target]] = _no_targets
    quick: dict[str, Any] = field(default_factory=dict)
    default: bool = True


def log(message: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def get(results: dict[str, Any], *path: str) -> Any:
    """results[path[0]][path[1]]…, or None where a step is missing or None."""
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node or node[key] is None:
            return None
        node = node[key]
    return node


def target(name: str, figure: Any, goal: str, ok: bool | None) -> Target:
    """One row of the targets table; `ok` None for a figure printed without a target."""
    return {"target": name, "figure": figure, "goal": goal,
            "result": "n/a" if ok is None else ("PASS" if ok else "MISS")}


def three(m: dict[str, Any], scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    """A median_of() figure as text: its median, then every value."""
    return "median " + fmt.format(m["median"] * scale) + " of " + ", ".join(
        fmt.format(v * scale) for v in m["values"])
