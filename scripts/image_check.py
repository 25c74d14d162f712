"""The built image run as k8s/base runs it, with podman: the migration as the Job runs it, then a
worker as the Deployment runs it (its ConfigMap's config.yaml, read-only root, every capability
dropped, uid and gid 10001, the keys file root-owned 0440 in the pod's group), one signed webhook
delivered to a receiver on this machine, the probes, /metrics, the image's HEALTHCHECK, and SIGTERM
with a request in flight. Run by scripts/image-check.sh after it has built the image."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.receiver import Receiver, Reply
from worker.encryption import generate_key
from worker.localpg import LocalPostgres, _free_port, login_role
from worker.rules.signing import verify

ROOT = Path(__file__).resolve().parent.parent
K8S_BASE = ROOT / "k8s" / "base"
# slirp4netns gives each container a network of its own and shows the host's loopback at this
# address, so the container's port 8080 (the HEALTHCHECK's) is its own and PostgreSQL and the
# receiver stay on 127.0.0.1.
HOST_FROM_CONTAINER = "10.0.2.2"
NETWORK = "slirp4netns:allow_host_loopback=true"
POD_UID = POD_GID = 10001
SECRET = "whsec_" + "aW1hZ2UtY2hlY2stc2lnbmluZy1zZWNyZXQh"
# A request the receiver holds this long is in flight when SIGTERM comes.
IN_FLIGHT_SECONDS = 3.0
WAIT_SECONDS = 60.0


class CheckFailed(Exception):
    pass


def log(message: str) -> None:
    print(f"image-check: {message}", file=sys.stderr, flush=True)


def until(what: str, condition: Callable[[], Any], timeout: float = WAIT_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def deployment() -> dict[str, Any]:
    """The worker's pod spec, read from k8s/base/deployment.yaml."""
    document = yaml.safe_load((K8S_BASE / "deployment.yaml").read_text())
    return document["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def pod_flags(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    """podman's flags for what the pod's and the container's securityContext ask of the runtime."""
    pod_context, context = pod["securityContext"], container["securityContext"]
    flags = ["--user", f"{pod_context['runAsUser']}:{pod_context['runAsGroup']}"]
    if "fsGroup" in pod_context:  # the kubelet adds it to every container's groups
        flags += ["--group-add", str(pod_context["fsGroup"])]
    if context.get("readOnlyRootFilesystem"):
        flags.append("--read-only")
    if context.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    for capability in context.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", capability]
    return flags


class Podman:
    def __init__(self, image: str) -> None:
        self.image = image
        self.names: list[str] = []

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                                check=False)
        if check and result.returncode != 0:
            raise CheckFailed(f"podman {' '.join(args[:3])}… exited {result.returncode}: "
                              f"{result.stderr[-2000:]}{result.stdout[-2000:]}")
        return result

    def name(self, role: str) -> str:
        name = f"image-check-{role}-{uuid.uuid4().hex[:8]}"
        self.names.append(name)
        return name

    def remove_all(self) -> None:
        for name in self.names:
            self.run("rm", "--force", "--time", "0", name, check=False)


def secret_file(pod: dict[str, Any], volume: dict[str, Any]) -> tuple[int, int, int]:
    """Owner, group and mode of the files the kubelet makes for a Secret volume of `pod`: owned by
    root, with the volume's defaultMode (0644 unless given); with an fsGroup they are in that group,
    which gets read access too (the kubelet's volume ownership for a read-only volume adds 0440)."""
    mode = int(volume["secret"].get("defaultMode", 0o644))
    fs_group = pod.get("securityContext", {}).get("fsGroup")
    if fs_group is None:
        return 0, 0, mode
    return 0, int(fs_group), mode | 0o440


def can_read(uid: int, groups: set[int], file: tuple[int, int, int]) -> bool:
    """Whether a process of `uid` in `groups` may read a file of (owner, group, mode)."""
    owner, group, mode = file
    if uid == owner:
        return bool(mode & 0o400)
    if group in groups:
        return bool(mode & 0o040)
    return bool(mode & 0o004)


def keys_directory(parent: Path, keys: str, group: int, mode: int) -> Path:
    """A directory holding `keys` as the kubelet makes a Secret volume's file: owned by root, in
    `group` (the pod's fsGroup, or root without one), with `mode` (the volume's defaultMode)."""
    directory = Path(tempfile.mkdtemp(prefix="keys-", dir=parent))
    directory.chmod(0o755)
    path = directory / "keys"
    path.write_text(keys + "\n")
    os.chown(path, 0, group)
    path.chmod(mode)
    return directory


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


@contextmanager
def database() -> Iterator[str]:
    """A database of the check's own (owner's URL): on DATABASE_URL's server, or a throwaway cluster."""
    server = os.environ.get("DATABASE_URL")
    if not server:
        with LocalPostgres() as local:
            yield local.url
        return
    name = f"image_check_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield make_conninfo(server, dbname=name)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def from_container(dsn: str) -> str:
    """The same connection string as a container on NETWORK reaches it."""
    host = conninfo_to_dict(dsn).get("host", "")
    if host in ("127.0.0.1", "localhost", "::1"):
        return make_conninfo(dsn, host=HOST_FROM_CONTAINER)
    return dsn


def check(image: str, work: Path) -> dict[str, float]:
    figures: dict[str, float] = {}
    pod = deployment()
    [container] = pod["containers"]
    flags = pod_flags(pod, container)
    config_map = yaml.safe_load((K8S_BASE / "configmap.yaml").read_text())
    config_dir = work / "config"
    config_dir.mkdir(mode=0o755)
    (config_dir / "config.yaml").write_text(config_map["data"]["config.yaml"])
    [keys_mount] = [m for m in container["volumeMounts"] if m["name"] == "keys"]
    [keys_volume] = [v for v in pod["volumes"] if v["name"] == "keys"]
    keys = generate_key()
    _, group, mode = secret_file(pod, keys_volume)
    keys_dir = keys_directory(work, keys, group, mode)
    grace = float(yaml.safe_load(config_map["data"]["config.yaml"])["worker"]["shutdown_grace_seconds"])

    podman = Podman(image)
    receiver = Receiver().start()
    try:
        with database() as owner:
            worker_login = f"image_check_worker_{uuid.uuid4().hex[:8]}"
            try:
                figures |= _run(podman, receiver, owner, worker_login, flags, config_dir, keys_dir,
                                keys_mount["mountPath"], work, grace)
            finally:
                podman.remove_all()
                with psycopg.connect(owner, autocommit=True) as conn, suppress(psycopg.Error):
                    conn.execute(f"DROP OWNED BY {worker_login}")
                    conn.execute(f"DROP ROLE IF EXISTS {worker_login}")
    finally:
        receiver.stop()
    return figures


def _run(podman: Podman, receiver: Receiver, owner: str, worker_login: str, flags: list[str],
         config_dir: Path, keys_dir: Path, keys_path: str, work: Path, grace: float) -> dict[str, float]:
    figures: dict[str, float] = {}
    allow = f"[{HOST_FROM_CONTAINER}/32]"  # the receiver, seen from the container
    mounts = ["-v", f"{config_dir}:/etc/webhook-worker:ro", "-v", f"{keys_dir}:{keys_path}:ro",
              "--tmpfs", "/tmp:size=64m"]
    common = ["--network", NETWORK, *flags, "-e", f"WEBHOOK_WORKER_SECURITY__ALLOW_NETWORKS={allow}"]

    # The Job: `migrate` as the schema owner, no config file.
    started = time.monotonic()
    podman.run("run", "--rm", "--name", podman.name("migrate"), *common, "-e",
               f"DATABASE_URL={from_container(owner)}", podman.image, "migrate", timeout=180)
    figures["migrate_seconds"] = time.monotonic() - started
    log(f"migrated by the image as the Job runs it ({figures['migrate_seconds']:.1f} s)")

    # Registered as README says: the schema owner, with the keys.
    added = podman.run("run", "--rm", "--name", podman.name("register"), *common, *mounts, "-e",
                       f"DATABASE_URL={from_container(owner)}", podman.image, "endpoints", "add",
                       "--config", "/etc/webhook-worker/config.yaml", "--name", "image-check",
                       "--url", f"http://{HOST_FROM_CONTAINER}:{receiver.port}/hook", "--secret", SECRET,
                       "--json")
    endpoint_id = int(json.loads(added.stdout)["id"])
    worker_dsn = login_role(owner, worker_login, "webhooks_worker", "image-check-only")

    # A Secret file Kubernetes would make root:root 0400 (no fsGroup) cannot be read by uid 10001:
    # the worker says so and exits 2. This is what the check above reads from the manifest.
    unreadable = keys_directory(work, "unused", 0, 0o400)
    refused = podman.run("run", "--rm", "--name", podman.name("unreadable"), *common, "-v",
                         f"{config_dir}:/etc/webhook-worker:ro", "-v", f"{unreadable}:{keys_path}:ro",
                         "-e", f"DATABASE_URL={from_container(worker_dsn)}", podman.image, check=False)
    if refused.returncode != 2 or "Permission denied" not in refused.stderr + refused.stdout:
        raise CheckFailed(f"a keys file of root:root 0400 should stop the worker with exit 2, got "
                          f"{refused.returncode}: {refused.stderr[-1000:]}")

    # The Deployment: the image's own ENTRYPOINT and CMD, the ConfigMap's config.yaml.
    port = _free_port()
    name = podman.name("worker")
    started = time.monotonic()
    podman.run("run", "--detach", "--name", name, *common, *mounts, "--publish", f"127.0.0.1:{port}:8080",
               # podman would schedule the HEALTHCHECK with systemd timers; here it is run below.
               "--health-interval", "disable",
               "-e", f"DATABASE_URL={from_container(worker_dsn)}", podman.image)
    base = f"http://127.0.0.1:{port}"

    def probe(path: str) -> bool:
        if podman.run("container", "exists", name, check=False).returncode != 0 or not running(podman, name):
            raise CheckFailed(f"the worker stopped: {podman.run('logs', name, check=False).stderr[-3000:]}")
        return http_get(base + path)[0] == 200

    for path in ("/startup", "/health", "/ready"):
        until(f"{path} to answer 200", partial(probe, path))
    figures["ready_seconds"] = time.monotonic() - started
    log(f"worker ready ({figures['ready_seconds']:.1f} s): /startup, /health and /ready answer 200")

    health = podman.run("healthcheck", "run", name, check=False)
    if health.returncode != 0:
        raise CheckFailed(f"the image's HEALTHCHECK failed: {health.stdout}{health.stderr}")
    log("the image's HEALTHCHECK passes")

    with psycopg.connect(owner, autocommit=True) as conn:
        [(delivery_id,)] = conn.execute(
            "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
            " VALUES (%s, 'image.check', '{\"hello\": \"from the image\"}') RETURNING delivery_id",
            (endpoint_id,)).fetchall()
    [request] = until("the delivery to reach the receiver", lambda: receiver.to("/hook"))
    verify(SECRET, request.headers, request.body)
    if json.loads(request.body) != {"hello": "from the image"}:
        raise CheckFailed(f"unexpected body {request.body!r}")
    until("the delivery to be recorded", lambda: status(owner, delivery_id) == "delivered")
    log("one webhook delivered, its signature verified")

    code, metrics = http_get(base + "/metrics")
    delivered = [line for line in metrics.splitlines()
                 if line.startswith("webhook_worker_deliveries_total{") and 'outcome="delivered"' in line]
    if code != 200 or not delivered or float(delivered[0].rsplit(" ", 1)[1]) < 1:
        raise CheckFailed(f"/metrics answered {code} without a delivered count: {delivered}")
    log("/metrics counts it")

    # SIGTERM with a request in flight: the worker waits for its answer, records it, exits 0.
    receiver.script("/hook", Reply(delay=IN_FLIGHT_SECONDS))
    with psycopg.connect(owner, autocommit=True) as conn:
        [(held_id,)] = conn.execute(
            "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
            " VALUES (%s, 'image.check', '{}') RETURNING delivery_id", (endpoint_id,)).fetchall()
    until("the second request to arrive", lambda: len(receiver.to("/hook")) == 2)
    stopped = time.monotonic()
    podman.run("kill", "--signal", "TERM", name)
    exit_code = until("the worker to exit", lambda: exited(podman, name), timeout=grace + 15)
    figures["sigterm_seconds"] = time.monotonic() - stopped
    if exit_code != "0":
        raise CheckFailed(f"the worker exited {exit_code} on SIGTERM")
    if status(owner, held_id) != "delivered":
        raise CheckFailed(f"the request in flight at SIGTERM was not recorded: {status(owner, held_id)}")
    log(f"SIGTERM with a {IN_FLIGHT_SECONDS:.0f} s request in flight: delivered, exit 0 after "
        f"{figures['sigterm_seconds']:.1f} s (grace {grace:.0f} s)")
    return figures


def running(podman: Podman, name: str) -> bool:
    state = podman.run("inspect", "--format", "{{.State.Running}}", name, check=False)
    return state.stdout.strip() == "true"


def exited(podman: Podman, name: str) -> str | None:
    state = podman.run("inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name, check=False)
    is_running, _, code = state.stdout.strip().partition(" ")
    return None if is_running != "false" else code


def status(dsn: str, delivery_id: int) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                           (delivery_id,)).fetchone()
    return str(row[0]) if row else "missing"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="image_check", description=__doc__)
    parser.add_argument("--image", required=True, help="the image to run, as podman names it")
    args = parser.parse_args(argv)
    if shutil.which("podman") is None:
        log("podman not found (scripts/image-check.sh installs it)")
        return 1
    work = Path(tempfile.mkdtemp(prefix="webhook-worker-image-check-"))
    work.chmod(0o755)
    try:
        figures = check(args.image, work)
    except CheckFailed as failure:
        log(f"FAILED: {failure}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({k: round(v, 2) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
