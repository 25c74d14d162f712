#!/usr/bin/env bash
# Builds the Dockerfile as it is, with Debian's podman, and runs the image as the Kubernetes Job and
# Deployment run it (scripts/image_check.py): migrate, deliver one signed webhook to a receiver on
# this machine, the probes, /metrics, the HEALTHCHECK, SIGTERM with a request in flight.
#
# No container registry is needed: the Dockerfile's base image (FROM python:3.11-slim) is made from
# Debian's packages with mmdebstrap and kept between runs in podman's storage under
# $IMAGE_CHECK_DIR (default /var/tmp/webhook-worker-image-check). Run as root, it installs podman,
# runc and mmdebstrap with apt-get when they are missing. Extra arguments go to scripts/image_check.py
# (--help); DATABASE_URL, when set, names a server to create the check's database on (otherwise a
# throwaway cluster is started, as the test suite does).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
STATE=${IMAGE_CHECK_DIR:-/var/tmp/webhook-worker-image-check}
BASE_IMAGE=docker.io/library/python:3.11-slim
IMAGE=localhost/webhook-worker:check
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
started=$SECONDS

say() { printf 'image-check: %s\n' "$*" >&2; }
fail() { say "$*"; exit 1; }

[ -x "$PYTHON" ] || fail "$PYTHON not found: run scripts/test.sh (or scripts/bootstrap.sh) once first, or set PYTHON"
[ "$(id -u)" = 0 ] || fail "run as root: podman builds and runs here rootful (rootless needs subordinate ids this machine's accounts do not have)"

missing=()
for tool in podman runc mmdebstrap slirp4netns; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || fail "missing ${missing[*]}: install Debian's podman, runc, slirp4netns and mmdebstrap"
    say "installing podman, runc, slirp4netns and mmdebstrap with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        podman runc slirp4netns mmdebstrap >/dev/null
fi

mkdir -p "$STATE"
# One check at a time per state directory: they share the base image and the image's tag.
exec 9>"$STATE/lock"
flock 9

# podman's settings for this machine, kept apart from any system-wide ones:
# - runc: Debian's podman would take crun where installed; runc is what it is tested with here.
# - default_ulimits: podman asks for 1048576 open files and processes unless told, and the container
#   cannot get more than podman itself has. podman lowers its own process limit to 32768 at start,
#   and without CAP_SYS_RESOURCE (this sandbox's root lacks it) nothing can raise a hard limit, so
#   runc fails with "error setting rlimit type 6 (or 7): operation not permitted" unless the
#   defaults stay within both.
# - cgroupfs: no systemd runs here to manage cgroups; the events go to a file for the same reason.
nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=1048576
[ "$nofile" -gt 1048576 ] && nofile=1048576
nproc=$(ulimit -Hu); { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
cat >"$STATE/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
cat >"$STATE/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$STATE/storage"
runroot = "$STATE/run"
EOF
export CONTAINERS_CONF=$STATE/containers.conf CONTAINERS_STORAGE_CONF=$STATE/storage.conf

# The base: Debian bookworm (Python 3.11, as the official image), minbase plus python3 and pip. Like
# the official image, `python` is python3 and pip may install into the system Python (Debian marks
# it externally managed). Made again when this recipe changes.
recipe="minbase bookworm python3 python3-pip python-is-python3 merged-usr no-docs externally-managed-removed v1"
stamp=$STATE/base.recipe
if ! podman image exists "$BASE_IMAGE" || [ "$(cat "$stamp" 2>/dev/null)" != "$recipe" ]; then
    say "making $BASE_IMAGE from Debian's packages (mmdebstrap); kept for later runs"
    mark=$SECONDS
    # streamed: the tarball never touches the disk
    mmdebstrap --quiet --variant=minbase --include=python3,python3-pip,python-is-python3 \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
        --format=tar bookworm - | podman import --quiet - "$BASE_IMAGE" >/dev/null
    echo "$recipe" >"$stamp"
    say "base image made in $((SECONDS - mark)) s"
fi

# The build reaches the package index this machine's pip uses: its CA bundle (a proxy may sign the
# index's certificate), its pip configuration files, and what its PIP_* variables set (written as a
# pip.conf, since a build's RUN steps see no variable of ours) are mounted into every RUN step.
# --format docker keeps HEALTHCHECK (OCI images have no such field).
ca=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
mounts=(-v "$ca:/etc/ssl/certs/ca-certificates.crt:ro")
[ -f /etc/pip.conf ] && mounts+=(-v /etc/pip.conf:/etc/pip.conf:ro)
[ -d /etc/xdg/pip ] && mounts+=(-v /etc/xdg/pip:/etc/xdg/pip:ro)
{
    echo "[global]"
    echo "cert = /etc/ssl/certs/ca-certificates.crt"
    [ -n "${PIP_INDEX_URL:-}" ] && echo "index-url = $PIP_INDEX_URL"
    [ -n "${PIP_EXTRA_INDEX_URL:-}" ] && echo "extra-index-url = $PIP_EXTRA_INDEX_URL"
    [ -n "${PIP_TRUSTED_HOST:-}" ] && echo "trusted-host = $PIP_TRUSTED_HOST"
    [ -n "${PIP_DEFAULT_TIMEOUT:-}" ] && echo "timeout = $PIP_DEFAULT_TIMEOUT"
    true
} >"$STATE/pip.conf"
mounts+=(-v "$STATE/pip.conf:/root/.config/pip/pip.conf:ro")
say "building the Dockerfile with podman"
mark=$SECONDS
log=$STATE/build.log
if ! podman build --format docker --network host --pull=never "${mounts[@]}" \
        -t "$IMAGE" . >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    fail "the build failed (whole log: $log)"
fi
# A warning of useradd or of podman itself is a defect of the Dockerfile (pip's about running as
# root is every Python image's).
if grep -E -i "^(useradd|groupadd)[: ].*warning|level=warn" "$log" >&2; then
    fail "the build warned (whole log: $log)"
fi
say "built in $((SECONDS - mark)) s"
podman image prune --force >/dev/null

mark=$SECONDS
"$PYTHON" -m scripts.image_check --image "$IMAGE" "$@"
say "image checked in $((SECONDS - mark)) s; $((SECONDS - started)) s in all"
