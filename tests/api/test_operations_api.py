"""Bulk replay as an operation that runs in steps and can be followed; stats and config."""

from __future__ import annotations

import json

from tests.acceptance.test_cli import cli
from tests.api.test_routes import dead_letter
from tests.support import add_endpoint, eventually, query


def test_bulk_replay_runs_to_done_within_its_max_and_filter(api, role_tokens, db):
    target = add_endpoint(db, "https://example.com/a", name="target")
    other = add_endpoint(db, "https://example.com/b", name="other")
    mine = [dead_letter(db, target) for _ in range(5)]
    theirs = dead_letter(db, other)
    started = api.post(
        "/v1/dead-letters/replay",
        role_tokens["admin"],
        {"filter": {"endpoint": "target", "category": "http_4xx"}, "max": 3, "rate": 1000},
    )
    assert started.status == 202, started.body
    operation = started.json["id"]
    assert started.headers["location"] == f"/v1/operations/{operation}"
    done = eventually(
        lambda: (
            (a := api.get(f"/v1/operations/{operation}", role_tokens["reader"])).json["status"] == "done"
            and a
        ),
        message="operation done",
    )
    assert done.json["processed"] == 3 and done.json["requested_by"].startswith("api:admin-")
    statuses = dict(query(db, "SELECT delivery_id, status FROM webhooks.alert_delivery_queue"))
    assert [statuses[d] for d in mine] == ["pending"] * 3 + ["dead_letter"] * 2  # oldest first
    assert statuses[theirs] == "dead_letter"


def test_a_bulk_replay_left_running_is_resumed(api, role_tokens, db):
    endpoint = add_endpoint(db, "https://example.com/a", name="resumed")
    rows = [dead_letter(db, endpoint) for _ in range(3)]
    # as a process that stopped mid-way leaves it: running, one row done
    [(operation,)] = query(db, "SELECT webhooks.api_start_replay('{}', NULL, NULL, 'gone')")
    query(db, "SELECT webhooks.api_replay_step(%s, 1)", (operation,))
    eventually(
        lambda: (
            query(db, "SELECT status, processed FROM webhooks.api_operations WHERE id = %s", (operation,))
            == [("done", 3)]
        ),
        message="resumed to done",
    )
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue WHERE status = 'pending'") == [
        (len(rows),)
    ]


def test_bulk_replay_refuses_bad_input(api, role_tokens, db):
    admin = role_tokens["admin"]
    for body, field in (
        ({"filter": {"endpoint": "nowhere"}}, "filter.endpoint"),
        ({"filter": {"since": "last week"}}, "filter.since"),
        ({"filter": {"category": "http_418"}}, "filter.category"),
        ({"rate": 0}, "rate"),
        ({"max": "all"}, "max"),
        ({"filters": {}}, "filters"),
    ):
        answer = api.post("/v1/dead-letters/replay", admin, body)
        assert answer.status == 422 and answer.json["field"] == field, (body, answer.body)
    assert query(db, "SELECT count(*) FROM webhooks.api_operations") == [(0,)]


def test_stats_and_config(api, role_tokens, db):
    endpoint = add_endpoint(db, "https://example.com/a", name="counted")
    dead_letter(db, endpoint)
    stats = api.get("/v1/stats", role_tokens["reader"])
    assert stats.status == 200
    assert {row["status"]: row["deliveries"] for row in stats.json["queue"]}.get("dead_letter") == 1
    config = api.get("/v1/config", role_tokens["reader"])
    assert config.status == 200 and config.json["max_attempts"] == 10
    changed = api.request(
        "PATCH",
        "/v1/config",
        role_tokens["admin"],
        {"max_attempts": 4, "retry_schedule": {"delays": [1, 2]}, "notify_enabled": True},
    )
    assert changed.status == 200 and changed.json["max_attempts"] == 4
    for body, field in (
        ({"max_attempts": "4"}, "max_attempts"),
        ({"max_attempts": 1000}, "max_attempts"),
        ({"nonsense": 1}, "nonsense"),
        ({"retry_schedule": {"delays": []}}, "retry_schedule"),
        ({"lease_seconds": 1}, "lease_seconds"),
        ({"max_attempts": 5, "lease_seconds": 1}, "(body)"),
    ):
        answer = api.request("PATCH", "/v1/config", role_tokens["admin"], body)
        assert answer.status == 422 and answer.json["field"] == field, (body, answer.body)
    assert query(db, "SELECT max_attempts FROM webhooks.delivery_config") == [(4,)]


def test_an_operation_that_cannot_go_on_fails_with_why_and_the_others_go_on(api, role_tokens, db):
    endpoint = add_endpoint(db, "https://example.com/a", name="survivor")
    dead_letter(db, endpoint)
    # a filter no step can read (written past the API's checks)
    [(broken,)] = query(
        db, "SELECT webhooks.api_start_replay(%s::jsonb, NULL, NULL, 't')", ('{"since": "not a time"}',)
    )
    started = api.post("/v1/dead-letters/replay", role_tokens["admin"], {"filter": {"endpoint": "survivor"}})
    healthy = started.json["id"]
    eventually(
        lambda: api.get(f"/v1/operations/{healthy}", role_tokens["reader"]).json["status"] == "done",
        message="the healthy operation done",
    )
    failed = api.get(f"/v1/operations/{broken}", role_tokens["reader"]).json
    assert failed["status"] == "failed" and "not a time" in failed["error"]


def fail_again(db, delivery_ids):
    """As a receiver that refuses again would leave them: dead letters once more, of a later time."""
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter',"
              " failure_category = 'http_4xx', dead_lettered_at = clock_timestamp()"
              " WHERE delivery_id = ANY(%s) AND status = 'pending'",
          (delivery_ids,))


def test_a_bulk_replay_whose_rows_keep_failing_replays_each_once_and_ends(db):
    endpoint = add_endpoint(db, "https://example.com/refuses", name="refuses")
    rows = [dead_letter(db, endpoint) for _ in range(5)]
    [(operation,)] = query(db, "SELECT webhooks.api_start_replay('{}', NULL, NULL, 'test')")
    steps = []
    for _ in range(10):  # bounded: five rows two at a time need three steps
        [(status, processed)] = query(db, "SELECT * FROM webhooks.api_replay_step(%s, 2)", (operation,))
        steps.append((status, processed))
        fail_again(db, rows)
        if status != "running":
            break
    assert steps == [("running", 2), ("running", 4), ("done", 5)]
    assert query(db, "SELECT delivery_id, replays FROM webhooks.alert_delivery_queue ORDER BY 1") == [
        (row, 1) for row in rows]


def test_the_cli_s_replay_all_ends_while_its_rows_keep_failing(db):
    endpoint = add_endpoint(db, "https://example.com/refuses", name="refuses")
    rows = [dead_letter(db, endpoint) for _ in range(3)]
    # a trigger stands in for the receiver that refuses at once: each replayed row is a dead letter again
    query(db, """
        CREATE FUNCTION public.refuse_again() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.status := 'dead_letter'; NEW.dead_lettered_at := clock_timestamp(); RETURN NEW;
        END $$""")
    query(db, "CREATE TRIGGER refuse_again BEFORE UPDATE OF status ON webhooks.alert_delivery_queue"
              " FOR EACH ROW WHEN (NEW.status = 'pending') EXECUTE FUNCTION public.refuse_again()")
    result = cli("replay", "--all", "--endpoint", "refuses", "--batch", "1", "--json",
                 env={"DATABASE_URL": db}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"replayed": 3}
    assert query(db, "SELECT delivery_id, replays FROM webhooks.alert_delivery_queue ORDER BY 1") == [
        (row, 1) for row in rows]


def test_a_running_bulk_replay_is_cancelled_over_the_api(api, role_tokens, db):
    endpoint = add_endpoint(db, "https://example.com/a", name="slow")
    for _ in range(30):
        dead_letter(db, endpoint)
    admin = role_tokens["admin"]
    # one row a second: it is still running when cancelled, however busy the machine
    started = api.post("/v1/dead-letters/replay", admin, {"filter": {"endpoint": "slow"}, "rate": 1})
    operation = started.json["id"]
    assert api.post(f"/v1/operations/{operation}/cancel", role_tokens["reader"]).status == 403
    cancelled = api.post(f"/v1/operations/{operation}/cancel", admin)
    assert cancelled.status == 200, cancelled.body
    assert cancelled.json["status"] == "cancelled" and cancelled.json["cancelled_by"].startswith("api:admin-")
    processed = cancelled.json["processed"]
    assert processed < 30
    assert api.post(f"/v1/operations/{operation}/cancel", admin).status == 200  # again: no change
    assert api.post("/v1/operations/999999/cancel", admin).status == 404
    # the API process's runner never steps it again: a later operation is done, this one unchanged
    [(other,)] = query(db, "SELECT webhooks.api_start_replay('{}', NULL, NULL, 'test')")
    eventually(lambda: query(db, "SELECT status FROM webhooks.api_operations WHERE id = %s", (other,))
               == [("done",)], message="a later operation done")
    assert query(db, "SELECT status, processed FROM webhooks.api_operations WHERE id = %s", (operation,)) == [
        ("cancelled", processed)]
    assert api.post(f"/v1/operations/{other}/cancel", admin).status == 409


def test_the_cli_lists_and_cancels_operations(db):
    [(running,)] = query(db, "SELECT webhooks.api_start_replay('{}', NULL, NULL, 'test')")
    [(done,)] = query(db, "SELECT webhooks.api_start_replay('{}', NULL, NULL, 'test')")
    query(db, "SELECT webhooks.api_replay_step(%s, 10)", (done,))  # nothing to replay: done
    result = cli("operations", "cancel", str(running), env={"DATABASE_URL": db})
    assert result.returncode == 0 and f"operation {running} cancelled" in result.stdout, result.stderr
    again = cli("operations", "cancel", str(running), env={"DATABASE_URL": db})  # as the API: no change
    assert again.returncode == 0, again.stderr
    refused = cli("operations", "cancel", str(done), env={"DATABASE_URL": db})
    assert refused.returncode == 1 and f"operation {done} is done already" in refused.stderr
    missing = cli("operations", "cancel", "999999", env={"DATABASE_URL": db})
    assert missing.returncode == 1 and "no operation with this id" in missing.stderr
    listed = cli("operations", "list", "--json", env={"DATABASE_URL": db})
    assert [(o["id"], o["status"], o["cancelled_by"]) for o in json.loads(listed.stdout)] == [
        (done, "done", None), (running, "cancelled", "cli")]


def test_the_cli_refuses_an_unknown_category_naming_the_allowed_ones(db):
    result = cli("dlq", "list", "--category", "http_418", env={"DATABASE_URL": db})
    assert result.returncode == 2 and "--category" in result.stderr and "http_5xx" in result.stderr


def test_a_bulk_replay_s_rate_holds_for_every_api_process_together(db):
    endpoint = add_endpoint(db, "https://example.com/a", name="paced")
    for _ in range(4):
        dead_letter(db, endpoint)
    # one row per 100 s: however slow the machine, the second step below comes before the next is due
    [(operation,)] = query(db, "SELECT webhooks.api_start_replay('{}', 0.01, NULL, 'test')")
    step = "SELECT status, processed FROM webhooks.api_replay_step(%s, 1)"
    assert query(db, step, (operation,)) == [("running", 1)]
    # a second process (another session) asking at once gets nothing: the step is not due
    assert query(db, step, (operation,)) == []
    [(wait,)] = query(db, "SELECT extract(epoch FROM next_step_at - now()) FROM webhooks.api_operations"
                          " WHERE id = %s", (operation,))
    assert 90 < wait <= 100
    # without a rate, steps follow each other
    [(unpaced,)] = query(db, "SELECT webhooks.api_start_replay('{}', NULL, NULL, 'test')")
    assert query(db, step, (unpaced,)) == [("running", 1)]
    assert query(db, step, (unpaced,)) == [("running", 2)]
