"""The image: the Dockerfile built as it is with podman and run as k8s/base runs it
(scripts/image-check.sh, which sets up podman and a Debian-made base image by itself)."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.support import ROOT

# A cold run (podman installed, the base image made from Debian's packages) takes a few minutes on
# a busy machine; later runs reuse the base image.
CHECK_TIMEOUT_SECONDS = 840


@pytest.mark.skipif(os.geteuid() != 0, reason="podman builds and runs rootful here: the check needs root")
@pytest.mark.timeout(CHECK_TIMEOUT_SECONDS + 60)
def test_the_image_builds_and_runs_as_the_job_and_the_deployment_run_it(pg_server):
    env = {**os.environ, "DATABASE_URL": pg_server, "PYTHON": sys.executable}
    result = subprocess.run(["bash", "scripts/image-check.sh"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=CHECK_TIMEOUT_SECONDS, check=False)
    assert result.returncode == 0, result.stderr[-6000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    config_map = yaml.safe_load((ROOT / "k8s" / "base" / "configmap.yaml").read_text())
    grace = yaml.safe_load(config_map["data"]["config.yaml"])["worker"]["shutdown_grace_seconds"]
    # the request in flight at SIGTERM took 3 s: the worker waited for it, well within its grace
    assert 3 <= figures["sigterm_seconds"] < grace, figures
    for step in ("migrated by the image as the Job runs it", "the image's HEALTHCHECK passes",
                 "one webhook delivered, its signature verified", "/metrics counts it"):
        assert step in result.stderr
