"""`keys generate|status|rotate`: the encryption keys that seal endpoint credentials."""

from __future__ import annotations

import argparse
import json
import sys

from worker.cli.base import EXIT_USAGE, Commands, UsageError, config_of, connect, emit, keyring_of, run_async
from worker.encryption import generate_key
from worker.store import endpoints as endpoint_store


def cmd_keys_generate(args: argparse.Namespace) -> int:
    print(generate_key())
    return 0


@run_async
async def cmd_keys_status(args: argparse.Namespace) -> int:
    config = config_of(args)
    keyring = keyring_of(config)
    async with connect(args) as conn:
        in_use = await endpoint_store.credential_keys(conn)
        unbound = await endpoint_store.unbound_credentials(conn, keyring)
    missing = keyring.missing(in_use)
    # unbound: plaintext, or sealed before values were bound to their endpoint (`keys rotate` binds)
    report = {"primary_key": keyring.primary_id, "held_keys": list(keyring.key_ids),
              "credentials_by_key": in_use, "missing_keys": missing, "unbound_credentials": unbound}
    emit(args, report)
    if missing:
        print(f"webhook-worker: credentials sealed with {', '.join(missing)} cannot be opened with "
              "these keys", file=sys.stderr)
        return EXIT_USAGE  # the keys given are configuration, and wrong
    return 0


@run_async
async def cmd_keys_rotate(args: argparse.Namespace) -> int:
    config = config_of(args)
    keyring = keyring_of(config)
    async with connect(args) as conn:
        missing = keyring.missing(await endpoint_store.credential_keys(conn))
        if missing:
            raise UsageError(
                f"credentials are sealed with {', '.join(missing)}, which these keys do not include: "
                "list the new key first and every old key after it")
        changed = await endpoint_store.reseal_credentials(conn, keyring)
        in_use = await endpoint_store.credential_keys(conn)
    if args.json:
        print(json.dumps({"primary_key": keyring.primary_id, "endpoints_changed": changed,
                          "credentials_by_key": in_use}))
    else:
        print(f"{changed} endpoints re-sealed; every credential is now sealed with key {keyring.primary_id}")
        print("once every worker runs with the new key first, the old keys can be removed")
    return 0



def register(cli: Commands) -> None:
    key_commands = cli.group(
        "keys", "the encryption keys that seal endpoint credentials",
        "The encryption keys that seal endpoint URLs and secrets in the database. Keys come from "
        "WEBHOOK_WORKER_ENCRYPTION_KEYS or security.encryption_keys_file: the first seals, all open.")
    cli.command(key_commands, "generate", cmd_keys_generate, "print a new random key (32 bytes, base64)")
    key_status = cli.command(key_commands, "status", cmd_keys_status,
                             "which keys sealed the stored credentials, and whether these keys open them all")
    key_status.add_argument("--json", action="store_true", help="print JSON")
    key_rotate = cli.command(key_commands, "rotate", cmd_keys_rotate,
                             "re-seal every stored credential with the first key (workers keep running)")
    key_rotate.add_argument("--json", action="store_true", help="print JSON")
