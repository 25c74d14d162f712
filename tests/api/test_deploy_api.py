"""The API's deployment files, checked offline: the Compose service and the optional k8s/api/."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.acceptance.test_deploy import K8S, rendered, tool
from tests.support import ROOT
from worker.config import ApiConfig

API = K8S / "api"


def test_compose_has_an_api_service_on_its_own_port_with_its_own_healthcheck():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    api = compose["services"]["api"]
    assert api["command"] == ["api"]
    assert api["ports"] == [f"127.0.0.1:{ApiConfig().port}:{ApiConfig().port}"]
    assert f"127.0.0.1:{ApiConfig().port}/health" in " ".join(api["healthcheck"]["test"])
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


@pytest.mark.parametrize("name", ["deployment.yaml", "service.yaml", "pdb.yaml"])
def test_api_manifests_validate_against_the_kubernetes_schemas(name):
    result = subprocess.run([tool("kubernetes-validate"), "--strict", "--quiet", str(API / name)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_api_deployment_runs_the_api_with_probes_on_its_port_and_stays_apart_from_workers():
    assert {kind for _, kind, _ in rendered(API)} == {"Deployment", "Service", "PodDisruptionBudget"}
    deployment = yaml.safe_load((API / "deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "api"
    assert container["ports"] == [{"name": "api", "containerPort": ApiConfig().port}]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert labels["app.kubernetes.io/component"] == "api"
    # the workers' Service, PDB and HPA select component=worker, so they never pick API pods
    worker_service = yaml.safe_load((K8S / "base" / "service.yaml").read_text())
    assert worker_service["spec"]["selector"]["app.kubernetes.io/component"] == "worker"
    # optional: the default kustomization leaves it out
    assert ("apps/v1", "Deployment", "webhook-worker-api") not in rendered(K8S)
