"""The API's deployment files, checked offline: the Compose service and the optional k8s/api/."""

from __future__ import annotations

import re
import subprocess
import tempfile

import pytest
import yaml
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.acceptance.test_deploy import K8S, rendered, tool
from tests.support import ROOT, query
from worker.config import ApiConfig
from worker.localpg import _find_binary
from worker.store.database import API_GROUPS

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


def _user(dsn: str) -> str:
    return conninfo_to_dict(dsn)["user"]


def _groups(statement: str) -> set[str]:
    """The roles a `GRANT a, b TO x` or `CREATE ROLE … IN ROLE a, b` statement names."""
    found = re.search(r"(?:GRANT|IN ROLE)\s+([\w\s,]+?)\s*(?:TO\b|;|$)", statement)
    assert found, statement
    return {name.strip() for name in found[1].split(",")}




def test_the_api_logs_in_as_a_role_of_its_own_wherever_it_is_deployed():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    owner = _user(services["migrate"]["environment"]["DATABASE_URL"])
    api_user = _user(services["api"]["environment"]["DATABASE_URL"])
    assert api_user != owner
    assert services["api"]["depends_on"]["api-login"]["condition"] == "service_completed_successfully"
    script = compose["configs"]["api-login"]["content"]
    assert f"CREATE ROLE {api_user} LOGIN NOINHERIT" in script
    [grant] = [line for line in script.splitlines() if line.startswith("GRANT")]
    assert _groups(grant) == set(API_GROUPS) and grant.endswith(f"TO {api_user};")
    secret = yaml.safe_load_all((K8S / "base" / "secret.yaml").read_text())
    [values] = [d["stringData"] for d in secret if d["metadata"]["name"] == "webhook-worker-db"]
    assert _user(values["api-url"]) not in (_user(values["owner-url"]), _user(values["url"]))
    # the statements the docs and the manifests give make it a member of exactly those roles (a
    # migration's text is frozen once released: 007_api_login.sql names the roles of its time, and
    # 015_self_service.sql the GRANT of the one it adds)
    for path in (ROOT / "docs" / "security.md", K8S / "base" / "secret.yaml",
                 K8S / "api" / "kustomization.yaml"):
        # comment markers and trailing comments gone, lines joined
        lines = [re.sub(r"^\s*(#|--)?\s*|\s+--\s.*$", "", line) for line in path.read_text().splitlines()]
        text = re.sub(r"\s+", " ", " ".join(lines))
        statements = re.findall(r"CREATE ROLE api_pod LOGIN NOINHERIT PASSWORD '…' IN ROLE [\w ,]+", text)
        assert statements, path
        assert all(_groups(s) == set(API_GROUPS) for s in statements), (path, statements)


def test_the_compose_api_login_script_makes_a_login_the_api_runs_as_without_a_warning(db):
    from tests.api.test_api_login import problems_of

    script = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["configs"]["api-login"]["content"]
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as file:
        file.write(script)
        file.flush()
        for _ in range(2):  # compose may run it again: a rerun changes nothing
            ran = subprocess.run([_find_binary("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", db,
                                  "-f", file.name], capture_output=True, text=True, check=False)
            assert ran.returncode == 0, ran.stderr
    try:
        assert problems_of(make_conninfo(db, user="api_pod", password="api_pod")) == []
    finally:
        query(db, "DROP ROLE api_pod")
