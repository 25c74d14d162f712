"""The commands that run something: the worker, the migrations, the HTTP API, the demo."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from worker import schema
from worker.cli.base import CommandFailed, Commands, config_of
from worker.errors import ConfigError
from worker.observability import configure_logging, get_logger


def cmd_run(args: argparse.Namespace) -> int:
    # Until the event loop installs its own handlers, SIGTERM means "nothing claimed yet: exit 0".
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    from worker import runtime
    from worker.daemon.worker import serve

    config = config_of(args)
    configure_logging(config.logging.level, config.logging.format)
    try:
        loop = runtime.chosen_loop(config.worker.event_loop, runtime.uvloop_installed())
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    log = get_logger()
    # Thousands of concurrent sockets (slow receivers, high worker.concurrency) need more than the
    # usual soft limit of 1,024 open files.
    raised = runtime.raise_open_files_limit()
    if raised is not None:
        log.info("open-files soft limit raised", before=raised[0], after=raised[1])
    with asyncio.Runner(loop_factory=runtime.loop_factory(loop)) as runner:
        running = type(runner.get_loop()).__module__.split(".")[0]  # the loop's package: what runs
        log.info("event loop chosen", loop=running, setting=config.worker.event_loop)
        runner.run(serve(config))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    config = config_of(args)
    try:
        applied = schema.migrate(config.database.url, on_notice=lambda message: print(f"note: {message}"))
    except schema.MigrationError as exc:
        raise CommandFailed(f"migrate: {exc}") from None
    for name in applied:
        print(f"applied {name}")
    print(f"schema at version {schema.latest_version()} ({len(applied)} applied)")
    for advice in schema.role_advice(config.database.url):
        print(advice, file=sys.stderr)
    return 0


def cmd_api(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    # the one place the HTTP API and the console meet: the API serves, with the console mounted
    from worker.api.app import serve as serve_api
    from worker.console import create_console_app

    config = config_of(args)
    configure_logging(config.logging.level, config.logging.format)
    asyncio.run(serve_api(config, create_console_app))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from worker.cli.demo import run_demo

    alerts: int = args.alerts
    return run_demo(alerts=alerts)



def register(cli: Commands) -> None:
    cli.command(None, "run", cmd_run, "run the worker until SIGTERM or SIGINT (the default)")
    cli.command(None, "migrate", cmd_migrate, "apply the schema migrations (safe to run concurrently)")
    cli.command(None, "api", cmd_api,
                "serve the HTTP API (/v1) and the console on api.host:api.port until SIGTERM or SIGINT")
    demo = cli.subparsers.add_parser(
        "demo", help="deliver sample alerts end to end on a local PostgreSQL and receiver",
        description="Start a throwaway PostgreSQL (unless DATABASE_URL is set), migrate, register a "
        "receiver on 127.0.0.1, enqueue sample alerts, deliver them and print the audit rows.",
    )
    demo.add_argument("--alerts", type=int, default=5, help="how many sample alerts (default 5)")
    demo.set_defaults(handler=cmd_demo)
