"""`webhook-worker tenants …` and `endpoints add --tenant`, run as subprocesses."""

import json

from tests.acceptance.test_cli import cli
from tests.support import enqueue, query


def run(db, *args):
    result = cli(*args, env={"DATABASE_URL": db})
    assert result.returncode == 0, result.stderr
    return result.stdout


def refused(db, *args):
    result = cli(*args, env={"DATABASE_URL": db})
    assert result.returncode != 0, result.stdout
    return result.stderr


def test_tenants_add_update_list_and_show(db):
    tenant_id = int(run(db, "tenants", "add", "acme", "--rate-limit", "50", "--max-endpoints", "2"))
    run(db, "tenants", "update", "acme", "--max-in-flight", "8", "--rate-limit", "none")
    shown = json.loads(run(db, "tenants", "show", "acme", "--json"))
    assert (shown["id"], shown["rate_limit_per_second"], shown["max_in_flight"], shown["max_endpoints"]) == (
        tenant_id, None, 8, 2)
    listed = json.loads(run(db, "tenants", "list", "--json"))
    assert [t["name"] for t in listed] == ["default", "acme"]
    endpoint = json.loads(run(db, "endpoints", "add", "--name", "a", "--url", "https://hooks.example.test/a",
                              "--tenant", "acme", "--json"))["id"]
    enqueue(db, endpoint, count=3)
    acme = json.loads(run(db, "tenants", "show", "acme", "--json"))
    assert (acme["endpoints"], acme["waiting"]) == (1, 3)
    assert query(db, "SELECT tenant_id FROM webhooks.endpoints WHERE id = %s", (endpoint,)) == [(tenant_id,)]


def test_bad_tenant_input_is_refused_naming_the_option(db):
    assert "--max-in-flight: must be 1 or more" in refused(db, "tenants", "add", "t", "--max-in-flight", "0")
    assert "--rate-limit" in refused(db, "tenants", "add", "t", "--rate-limit", "fast")
    assert "NAME: must be printable" in refused(db, "tenants", "add", "a b")
    run(db, "tenants", "add", "t", "--max-endpoints", "1")
    assert "a tenant with this name exists" in refused(db, "tenants", "add", "t")
    assert "no tenant with this name" in refused(db, "tenants", "update", "nobody", "--max-queued", "5")
    assert "nothing to change" in refused(db, "tenants", "update", "t")
    assert "--tenant: no tenant named 'nobody'" in refused(
        db, "endpoints", "add", "--name", "x", "--url", "https://hooks.example.test/x", "--tenant", "nobody")
    run(db, "endpoints", "add", "--name", "one", "--url", "https://hooks.example.test/1", "--tenant", "t")
    assert "tenant t: at its limit of 1 endpoints" in refused(
        db, "endpoints", "add", "--name", "two", "--url", "https://hooks.example.test/2", "--tenant", "t")
    assert query(db, "SELECT name FROM webhooks.tenants ORDER BY id") == [("default",), ("t",)]


def dead_letters_of(db, endpoint, count):
    ids = enqueue(db, endpoint, count=count)
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter',"
              " failure_category = 'http_4xx', dead_letter_reason = 'test', dead_lettered_at = now()"
              " WHERE delivery_id = ANY(%s)", (ids,))
    return ids


def test_tenant_filters_on_dlq_replay_all_and_status(db):
    run(db, "tenants", "add", "acme")
    acme = json.loads(run(db, "endpoints", "add", "--name", "a", "--url", "https://hooks.example.test/a",
                          "--tenant", "acme", "--json"))["id"]
    other = json.loads(run(db, "endpoints", "add", "--name", "b", "--url", "https://hooks.example.test/b",
                           "--json"))["id"]
    acme_dead, other_dead = dead_letters_of(db, acme, 2), dead_letters_of(db, other, 3)
    listed = json.loads(run(db, "dlq", "list", "--tenant", "acme", "--json"))
    assert sorted(d["delivery_id"] for d in listed) == acme_dead
    status = json.loads(run(db, "status", "--tenant", "acme", "--json"))
    assert {s["status"]: s["deliveries"] for s in status["queue"]}["dead_letter"] == 2
    assert [e["id"] for e in status["endpoints"]] == [acme]
    assert json.loads(run(db, "replay", "--all", "--tenant", "acme", "--json")) == {"replayed": 2}
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE status = 'dead_letter'"
                     " AND delivery_id = ANY(%s)", (other_dead,)) == [(3,)]
    assert "--tenant: no tenant named 'nobody'" in refused(db, "dlq", "list", "--tenant", "nobody")


def test_the_operators_channel_is_marked_for_every_tenants_operational_events_and_shown(db):
    # an endpoint receives its own tenant's operational events unless an operator marks it
    run(db, "tenants", "add", "acme")
    run(db, "endpoints", "add", "--name", "acme-ops", "--url", "https://hooks.example.test/a",
        "--tenant", "acme", "--event-type", "webhook.*")
    run(db, "endpoints", "add", "--name", "operator-ops", "--url", "https://hooks.example.test/o",
        "--event-type", "webhook.*", "--operational-all-tenants")
    assert "operational_all_tenants: False" in run(db, "endpoints", "show", "acme-ops").splitlines()
    shown = json.loads(run(db, "endpoints", "show", "operator-ops", "--json"))
    assert shown["operational_all_tenants"] is True
    assert "updated: operational_all_tenants" in run(db, "endpoints", "update", "acme-ops",
                                                     "--operational-all-tenants")
    run(db, "endpoints", "update", "operator-ops", "--no-operational-all-tenants")
    listed = {e["name"]: e["operational_all_tenants"]
              for e in json.loads(run(db, "endpoints", "list", "--json"))}
    assert listed == {"acme-ops": True, "operator-ops": False}


def test_a_tenant_is_granted_networks_and_its_endpoints_reach_those_alone(db):
    run(db, "tenants", "add", "acme", "--allow-networks", "10.1.2.3/16, 127.0.0.1")
    shown = json.loads(run(db, "tenants", "show", "acme", "--json"))
    assert shown["allow_networks"] == ["10.1.0.0/16", "127.0.0.1/32"]  # each as its network
    assert "10.1.0.0/16" in run(db, "tenants", "list")
    # the config's security.allow_networks is the operator's (the default tenant's), not acme's
    env = {"DATABASE_URL": db, "WEBHOOK_WORKER_SECURITY__ALLOW_NETWORKS": "[10.9.0.0/16]"}
    ours = cli("endpoints", "add", "--name", "ours", "--url", "http://10.9.0.1/hook", env=env)
    assert ours.returncode == 0, ours.stderr
    theirs = cli("endpoints", "add", "--name", "theirs", "--url", "http://10.9.0.1/hook", "--tenant", "acme",
                 env=env)
    assert theirs.returncode == 2, theirs.stderr
    assert "destination 10.9.0.1 is not allowed for this tenant" in theirs.stderr
    assert ("grant its network to tenant acme: webhook-worker tenants update acme --allow-networks "
            "10.1.0.0/16,127.0.0.1/32,10.9.0.1/32") in theirs.stderr
    run(db, "endpoints", "add", "--name", "theirs", "--url", "http://10.1.200.7/hook", "--tenant", "acme")
    # a new URL, by the endpoint's tenant
    moved = refused(db, "endpoints", "update", "theirs", "--url", "http://10.2.0.1/hook")
    assert "destination 10.2.0.1 is not allowed for this tenant" in moved
    run(db, "tenants", "update", "acme", "--allow-networks", "none")
    assert json.loads(run(db, "tenants", "show", "acme", "--json"))["allow_networks"] == []
    for value in ("intranet", "10.0.0.0/33"):
        bad = refused(db, "tenants", "update", "acme", "--allow-networks", value)
        assert f"--allow-networks: '{value}' is not an address or a CIDR" in bad
