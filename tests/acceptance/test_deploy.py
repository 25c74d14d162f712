"""The deployment files, checked offline: no Docker engine and no cluster needed."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.support import ROOT
from worker.config import LEASE_MARGIN_SECONDS, WorkerConfig
from worker.daemon import FINAL_FLUSH_SECONDS, RELEASE_SECONDS
from worker.observability import Metrics

K8S = ROOT / "k8s"
BASE = K8S / "base"
CORE = ["configmap.yaml", "deployment.yaml", "service.yaml", "pdb.yaml", "hpa.yaml", "migrate-job.yaml",
        "secret.yaml"]
CUSTOM = {"base/keda/scaledobject.yaml": ["ScaledObject", "TriggerAuthentication"],
          "servicemonitor.yaml": ["ServiceMonitor"], "prometheusrule.yaml": ["PrometheusRule"]}
OPERATOR_API = "monitoring.coreos.com/"


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    assert found, f"{name} is a dev dependency (pyproject.toml) and must be installed"
    return found


def test_the_dockerfile_passes_hadolint():
    result = subprocess.run([tool("hadolint"), "Dockerfile"], cwd=ROOT, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    text = (ROOT / "Dockerfile").read_text()
    assert "HEALTHCHECK" in text and "USER 10001" in text and 'ENTRYPOINT ["webhook-worker"]' in text


def test_the_compose_file_is_valid():
    command = [tool("docker-compose"), "-f", "docker-compose.yml", "config", "--quiet"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert {"postgres", "migrate", "worker", "receiver", "prometheus"} <= set(compose["services"])
    worker = compose["services"]["worker"]
    assert "container_name" not in worker and "ports" not in worker  # so that --scale works
    grace = int(worker["stop_grace_period"].rstrip("s"))
    assert grace > WorkerConfig().shutdown_grace_seconds + RELEASE_SECONDS + FINAL_FLUSH_SECONDS


@pytest.mark.parametrize("name", CORE)
def test_core_manifests_validate_against_the_kubernetes_schemas(name):
    result = subprocess.run([tool("kubernetes-validate"), "--strict", "--quiet", str(BASE / name)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(CUSTOM))
def test_custom_resources_validate_against_their_schemas(name):
    documents = list(yaml.safe_load_all((K8S / name).read_text()))
    assert [d["kind"] for d in documents] == CUSTOM[name]
    for document in documents:
        schema = json.loads((ROOT / "tests" / "schemas" / f"{document['kind']}.json").read_text())
        jsonschema.validate(document, schema)


def rendered(directory: Path) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of what `kubectl apply -k DIRECTORY` would apply, read as kustomize
    reads it: listed files, listed directories (kustomizations themselves) and generated ConfigMaps."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    found = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        assert path.exists() and path.resolve().is_relative_to(directory.resolve()), resource
        if path.is_dir():
            found += rendered(path)
        else:
            found += [(d["apiVersion"], d["kind"], d["metadata"]["name"])
                      for d in yaml.safe_load_all(path.read_text())]
    for generator in kustomization.get("configMapGenerator", []):
        for file in generator["files"]:
            assert (directory / file).is_file(), file
        found.append(("v1", "ConfigMap", generator["name"]))
    return sorted(found)


def test_the_kustomizations_list_files_that_exist_and_base_needs_no_crd():
    everything, base = rendered(K8S), rendered(BASE)
    operator = [r for r in everything if r[0].startswith(OPERATOR_API)]
    assert {kind for _, kind, _ in operator} == {"ServiceMonitor", "PrometheusRule"}
    assert base == sorted(set(everything) - set(operator))
    assert {kind for _, kind, _ in base} >= {"Deployment", "Job", "Service", "ConfigMap"}


def test_the_termination_grace_outlasts_prestop_plus_the_worker_s_drain():
    deployment = yaml.safe_load((BASE / "deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    configmap = yaml.safe_load((BASE / "configmap.yaml").read_text())
    worker = yaml.safe_load(configmap["data"]["config.yaml"]).get("worker", {})
    shutdown_grace = worker.get("shutdown_grace_seconds", WorkerConfig().shutdown_grace_seconds)
    drain = float(pre_stop[1]) + shutdown_grace + RELEASE_SECONDS + FINAL_FLUSH_SECONDS
    assert pod["terminationGracePeriodSeconds"] > drain
    probes = {k: container[k]["httpGet"]["path"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {"startupProbe": "/startup", "livenessProbe": "/health", "readinessProbe": "/ready"}


def test_the_shutdown_grace_outlasts_the_longest_request_the_default_lease_allows():
    # (issue 18) a request still open when the grace ends is interrupted and sent again
    [lease] = re.findall(r"lease_seconds\s+integer\s+NOT NULL DEFAULT (\d+)",
                         (ROOT / "sql" / "migrations" / "001_baseline.sql").read_text())
    longest_request = int(lease) - LEASE_MARGIN_SECONDS
    configmap = yaml.safe_load((BASE / "configmap.yaml").read_text())
    worker = yaml.safe_load(configmap["data"]["config.yaml"]).get("worker", {})
    example = yaml.safe_load((ROOT / "config.example.yaml").read_text())["worker"]
    for grace in (WorkerConfig().shutdown_grace_seconds, worker.get("shutdown_grace_seconds"),
                  example["shutdown_grace_seconds"]):
        assert grace is not None and grace > longest_request


def exported_metric_names() -> set[str]:
    names = set()
    for family in Metrics().registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    # label-less histograms and counters only expose their series once observed; add them all
    for family in Metrics().registry.collect():
        names.update(family.name + suffix for suffix in ("_total", "_bucket", "_count", "_sum", "_created"))
    return names


def test_every_metric_in_the_alerts_and_the_dashboard_is_exported():
    exported = exported_metric_names()
    rules = yaml.safe_load((K8S / "prometheusrule.yaml").read_text())
    expressions = [r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]]
    dashboard = json.loads((BASE / "grafana-dashboard.json").read_text())
    expressions += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for e in expressions for name in re.findall(r"webhook_worker_[a-z_]+", e)}
    assert used and used <= exported, used - exported


def test_every_alert_has_a_runbook():
    runbooks = (ROOT / "docs" / "runbooks.md").read_text().lower()
    rules = yaml.safe_load((K8S / "prometheusrule.yaml").read_text())
    for group in rules["spec"]["groups"]:
        for rule in group["rules"]:
            anchor = rule["annotations"]["runbook_url"].rsplit("#", 1)[1]
            assert f"## {rule['alert'].lower()}" in runbooks and anchor == rule["alert"].lower()


def test_the_readme_names_the_oldest_compose_that_reads_the_compose_file():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    inline_configs = any("content" in config for config in compose.get("configs", {}).values())
    oldest = "v2.23.1" if inline_configs else "v2"  # configs.*.content arrived in Compose 2.23.1
    assert f"Docker Compose **{oldest} or later**" in (ROOT / "README.md").read_text()
