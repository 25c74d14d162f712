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


@pytest.mark.parametrize("name", ["deployment.yaml", "service.yaml", "metrics-service.yaml", "pdb.yaml"])
def test_api_manifests_validate_against_the_kubernetes_schemas(name):
    result = subprocess.run([tool("kubernetes-validate"), "--strict", "--quiet", str(API / name)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_api_deployment_runs_the_api_with_probes_on_its_port_and_stays_apart_from_workers():
    assert {kind for _, kind, _ in rendered(API)} == {"Deployment", "Service", "PodDisruptionBudget"}
    deployment = yaml.safe_load((API / "deployment.yaml").read_text())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "api"
    assert container["ports"] == [{"name": "api", "containerPort": ApiConfig().port},
                                  {"name": "metrics", "containerPort": ApiConfig().metrics_port}]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    labels = deployment["spec"]["selector"]["matchLabels"]
    assert labels["app.kubernetes.io/component"] == "api"
    # the workers' Service, PDB and HPA select component=worker, so they never pick API pods
    worker_service = yaml.safe_load((K8S / "base" / "service.yaml").read_text())
    assert worker_service["spec"]["selector"]["app.kubernetes.io/component"] == "worker"
    # optional: the default kustomization leaves it out
    assert ("apps/v1", "Deployment", "webhook-worker-api") not in rendered(K8S)


def test_the_api_metrics_port_is_scraped_and_the_public_service_leaves_it_out():
    public = yaml.safe_load((API / "service.yaml").read_text())
    assert [p["targetPort"] for p in public["spec"]["ports"]] == ["api"]
    metrics = yaml.safe_load((API / "metrics-service.yaml").read_text())
    assert metrics["spec"]["selector"] == public["spec"]["selector"]
    assert metrics["spec"]["ports"] == [{"name": "metrics", "port": ApiConfig().metrics_port,
                                         "targetPort": "metrics"}]
    monitor = yaml.safe_load((K8S / "servicemonitor.yaml").read_text())
    # the ServiceMonitor selects the metrics Service, and scrapes its port by name
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
    assert {"port": "metrics", "path": "/metrics", "interval": "15s"} in monitor["spec"]["endpoints"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    prometheus = yaml.safe_load(compose["configs"]["prometheus"]["content"])
    api_job = next(job for job in prometheus["scrape_configs"] if job["job_name"] == "webhook-worker-api")
    assert api_job["dns_sd_configs"] == [{"names": ["api"], "type": "A", "port": ApiConfig().metrics_port}]
