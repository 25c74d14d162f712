"""Security end to end: credentials sealed at rest, destinations refused, roles, input bounds."""

import asyncio
import json
import socket
import subprocess
from datetime import UTC, datetime

import psycopg
import pytest

from tests.acceptance.test_cli import cli
from tests.receiver import Reply
from tests.support import (
    HANG_SECONDS,
    PRODUCER_LOGIN,
    READER_LOGIN,
    TEST_KEYRING,
    TEST_KEYS,
    add_endpoint,
    enqueue,
    eventually,
    login_as,
    query,
    statuses,
    wait_final,
    wait_started,
    worker_dsn,
)
from worker import schema
from worker.daemon.sender import Sender
from worker.encryption import KEYS_ENV, SIGNING_SECRET, Keyring, generate_key
from worker.localpg import LocalPostgres, _find_binary
from worker.rules import signing
from worker.rules.classification import Category
from worker.rules.destinations import DestinationRules, address_blocked
from worker.rules.model import Claimed

FAST_RETRY = {"delays": [0.1]}
ALLOW_LOOPBACK_ENV = {"WEBHOOK_WORKER_SECURITY__ALLOW_NETWORKS": "[127.0.0.1/32]"}


def test_a_dump_and_a_full_statement_log_hold_no_url_path_and_no_secret(receiver, spawn):
    secret = signing.generate_secret()
    path = "/services/T0CANARY/B0CANARY/URLPATHCANARY"
    receiver.script(path, Reply(500), Reply(200))
    with LocalPostgres({"log_statement": "all", "log_min_error_statement": "debug5"}) as local:
        schema.migrate(local.url)
        env = {"DATABASE_URL": local.url, **ALLOW_LOOPBACK_ENV}
        added = cli("endpoints", "add", "--name", "slack", "--url", receiver.url(path), "--secret", secret,
                    "--retry-delays", "0.1", env=env)
        assert added.returncode == 0, added.stderr
        queued = cli("enqueue", "--endpoint", "slack", "--payload", '{"alert": 1}', env=env)
        assert queued.returncode == 0, queued.stderr
        worker = spawn(local.url)
        eventually(lambda: query(local.url, "SELECT status FROM webhooks.alert_delivery_queue")
                   == [("delivered",)], message="delivered after one retry")
        rotated = cli("endpoints", "rotate-secret", "slack", "--json", env=env)
        new_secret = json.loads(rotated.stdout)["signing_secret"]
        assert cli("keys", "rotate", env={**env, KEYS_ENV: f"{generate_key()},{TEST_KEYS}"}).returncode == 0
        worker.stop()
        dump = subprocess.run(
            [_find_binary("pg_dump"), "--dbname", local.url, "--data-only", "--schema", "webhooks"],
            capture_output=True, text=True, check=True).stdout
        server_log = local.log.read_text(errors="replace")

    # the dump did hold the endpoint, and the log did record the statements of the whole cycle
    assert "enc:v1:" in dump and "slack" in dump
    for statement in ("register_endpoint", "webhooks.acquire", "webhooks.finish", "rotate_secret",
                      "store_endpoint_credentials"):
        assert statement in server_log, statement
    for canary in ("URLPATHCANARY", "T0CANARY", secret, secret.removeprefix("whsec_"), new_secret,
                   new_secret.removeprefix("whsec_")):
        assert canary not in dump
        assert canary not in server_log
    assert [r.headers["webhook-id"] for r in receiver.to(path)]  # it was delivered for real


def test_keys_are_rotated_while_workers_deliver(db, receiver, spawn):
    secret = signing.generate_secret()
    endpoint = add_endpoint(db, receiver.url("/rotating"), secret=secret)  # sealed with TEST_KEYS
    new_key = generate_key()
    new_id = Keyring.parse(new_key, KEYS_ENV).primary_id
    first = spawn(db, name="holds-both", keys=f"{TEST_KEYS},{new_key}")
    before = enqueue(db, endpoint, count=50)
    eventually(lambda: len(receiver.to("/rotating")) >= 10, message="deliveries flowing")

    rotated = cli("keys", "rotate", "--json", env={"DATABASE_URL": db, KEYS_ENV: f"{new_key},{TEST_KEYS}"})
    assert rotated.returncode == 0, rotated.stderr
    assert json.loads(rotated.stdout)["credentials_by_key"] == {new_id: 2}  # the URL and the secret
    during = enqueue(db, endpoint, count=50)
    wait_final(db, before + during, message="every row final")
    assert set(statuses(db, before + during).values()) == {"delivered"}

    second = spawn(db, name="new-key-only", keys=new_key)
    wait_started([second])
    first.stop()
    after = enqueue(db, endpoint, count=20)
    wait_final(db, after, message="delivered by the new-key worker")
    assert set(statuses(db, after).values()) == {"delivered"}
    for request in receiver.to("/rotating"):
        signing.verify(secret, request.headers, request.body)  # decrypted correctly throughout
    failures = query(db, "SELECT count(*) FROM webhooks.alert_delivery_log WHERE outcome <> 'delivered'")
    assert failures == [(0,)]

    # a worker given only the retired key refuses to start, in one line, instead of failing deliveries
    stale = spawn(db, name="old-key-only", keys=TEST_KEYS)
    assert stale.process.wait(HANG_SECONDS) == 2
    text = stale.log_path.read_text()
    assert f"sealed with key(s) {new_id}" in text and "Traceback" not in text
    assert TEST_KEYS not in text and new_key not in text
    keyless = spawn(db, name="no-key", keys="")
    assert keyless.process.wait(HANG_SECONDS) == 2
    assert "encryption key missing" in keyless.log_path.read_text()


HOSTILE_DESTINATIONS = [
    "http://127.0.0.1:{port}/loopback",
    "http://localhost:{port}/name-resolving-to-loopback",
    "http://2130706433:{port}/decimal",
    "http://0177.0.0.1:{port}/octal",
    "http://0x7f.0.0.1:{port}/hex",
    "http://[::ffff:127.0.0.1]:{port}/mapped",
    "http://[::1]:{port}/ipv6-loopback",
    "http://[64:ff9b::7f00:1]:{port}/nat64",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.1/private",
    "http://100.64.0.1/cgnat",
    "http://[fd00::1]/ula",
    "http://[fe80::1%251]/link-local",
    "http://224.0.0.1/multicast",
    "http://0.0.0.0:{port}/unspecified",
]


def test_private_destinations_are_refused_and_leave_the_endpoint_health_alone(db, receiver, spawn):
    endpoints = {}
    for template in HOSTILE_DESTINATIONS:
        url = template.format(port=receiver.port)
        endpoints[add_endpoint(db, url, retry_schedule=FAST_RETRY)] = url
    ids = [enqueue(db, endpoint)[0] for endpoint in endpoints]
    spawn(db, security={"allow_networks": []})  # the default policy: nothing private allowed
    wait_final(db, ids, message="every row final")

    rows = query(db, "SELECT webhook_id, status, attempts, failure_category, dead_letter_reason"
                     " FROM webhooks.alert_delivery_queue ORDER BY webhook_id")
    for webhook_id, status, attempts, category, reason in rows:
        print(f"{endpoints[webhook_id]:55} {status} {category}: {reason}")
        assert (status, attempts, category) == ("dead_letter", 1, "blocked"), endpoints[webhook_id]
        assert "is not a public address" in reason
    assert receiver.requests == []
    health = query(db, "SELECT consecutive_failures, circuit_state, health_status"
                       " FROM webhooks.webhook_health_metrics")
    assert set(health) == {(0, "closed", "unknown")}
    assert query(db, "SELECT count(*) FROM webhooks.endpoint_events") == [(0,)]


def test_require_https_refuses_plain_http(db, receiver, spawn):
    endpoint = add_endpoint(db, receiver.url("/plain"))
    [delivery] = enqueue(db, endpoint)
    spawn(db, security={"require_https": True})
    wait_final(db, [delivery], message="final")
    assert query(db, "SELECT status, failure_category, dead_letter_reason FROM webhooks.alert_delivery_queue"
                 ) == [("dead_letter", "blocked", "https is required (security.require_https)")]
    assert receiver.requests == []


def test_a_redirect_is_a_failure_and_its_target_receives_nothing(db, receiver, spawn):
    receiver.script("/moved", Reply(302, headers={"Location": receiver.url("/target")}))
    endpoint = add_endpoint(db, receiver.url("/moved"), max_attempts=1)
    [delivery] = enqueue(db, endpoint)
    spawn(db)
    wait_final(db, [delivery], message="final")
    assert query(db, "SELECT status, failure_category, last_http_status FROM webhooks.alert_delivery_queue"
                 ) == [("dead_letter", "redirect", 302)]
    assert receiver.to("/target") == [] and len(receiver.to("/moved")) == 1


class RebindingResolver:
    """Answers a public address the first time, then 127.0.0.1: DNS rebinding."""

    def __init__(self) -> None:
        self.answers = ["93.184.216.34", "127.0.0.1"]

    async def resolve(self, host, port=0, family=socket.AF_INET):
        address = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return [{"hostname": host, "host": address, "port": port, "family": socket.AF_INET, "proto": 0,
                 "flags": socket.AI_NUMERICHOST}]

    async def close(self):
        pass


def _claimed(url: str) -> Claimed:
    from uuid import uuid4

    from worker.rules.classification import RetrySchedule

    return Claimed(delivery_id=1, endpoint_id=1, event_id="evt_1", idempotency_key="evt_1",
                   event_type="alert.created", body=b"{}", attempt=1, max_attempts=1, lease_token=uuid4(),
                   locked_until=datetime.now(UTC), url=url, signing_secrets=(), headers={},
                   timeout_seconds=None, schedule=RetrySchedule())


def test_dns_rebinding_cannot_slip_past_an_earlier_check(receiver):
    resolver = RebindingResolver()
    policy = DestinationRules()
    url = f"http://rebinding.test:{receiver.port}/internal"

    async def scenario():
        # the check an attacker passes: at registration the name resolves to a public address
        [earlier] = await resolver.resolve("rebinding.test", receiver.port)
        assert address_blocked(earlier["host"], policy) is None
        sender = Sender(10, policy, resolver=resolver)
        await sender.start()
        try:
            return await sender.send(_claimed(url), b"{}", 5.0)
        finally:
            await sender.close()

    sent = asyncio.run(scenario())
    assert sent.result.failure is Category.BLOCKED
    assert "127.0.0.1" in (sent.result.error or "")
    assert receiver.requests == []


def test_least_privilege_roles(db, receiver):
    endpoint = add_endpoint(db, receiver.url("/roles"))
    [foreign] = enqueue(db, endpoint, payload={"owner": "another producer"})
    producer = login_as(db, PRODUCER_LOGIN, "webhooks_producer")
    reader = login_as(db, READER_LOGIN, "webhooks_reader")
    worker = worker_dsn(db)

    def denied(dsn, sql, params=None):
        with (
            psycopg.connect(dsn, autocommit=True) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute(sql, params)

    with psycopg.connect(producer, autocommit=True) as conn:
        conn.execute("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
                     " VALUES (%s, 'alert.created', '{\"n\": 1}')", (endpoint,))
        conn.execute("INSERT INTO webhooks.alert_delivery_queue"
                     " (webhook_id, event_type, payload, idempotency_key)"
                     " VALUES (%s, 'alert.created', '{}', 'k1') ON CONFLICT DO NOTHING", (endpoint,))
        assert conn.execute("SELECT webhooks.enqueue(%s, 'alert.created', '{}', 'k2')",
                            (endpoint,)).fetchone()
        assert conn.execute("SELECT webhooks.publish('alert.created', '{}')").fetchone() == (1,)
    denied(producer, "SELECT url, signing_secrets FROM webhooks.endpoints")
    denied(producer, "SELECT payload FROM webhooks.alert_delivery_queue WHERE delivery_id = %s", (foreign,))
    denied(producer, "SELECT * FROM webhooks.delivery(%s)", (foreign,))
    denied(producer, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, status)"
                     " VALUES (%s, 'x', '{}', 'delivered')", (endpoint,))
    denied(producer, "UPDATE webhooks.alert_delivery_queue SET attempts = 0")
    denied(producer, "SELECT * FROM webhooks.acquire('me', 10, 60)")

    # the fan-out trigger on an application's own table works for a producer that reads nothing
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.alerts (id serial PRIMARY KEY, title text)")
        conn.execute("CREATE TRIGGER alerts_webhooks AFTER INSERT ON public.alerts FOR EACH ROW"
                     " EXECUTE FUNCTION webhooks.observer_queue_alert('alert.created', 'id')")
        conn.execute(f"GRANT INSERT ON public.alerts TO {PRODUCER_LOGIN}")
        conn.execute(f"GRANT USAGE ON SEQUENCE public.alerts_id_seq TO {PRODUCER_LOGIN}")
    with psycopg.connect(producer, autocommit=True) as conn:
        conn.execute("INSERT INTO public.alerts (title) VALUES ('disk full')")
    fanned_out = "SELECT count(*) FROM webhooks.deliveries WHERE source_ref = 'alerts:1'"
    assert query(db, fanned_out) == [(1,)]

    with psycopg.connect(worker, autocommit=True) as conn:
        assert conn.execute("SELECT * FROM webhooks.worker_settings()").fetchone()
        assert conn.execute("SELECT webhooks.schema_version()").fetchone() == (schema.latest_version(),)
    denied(worker, "SELECT * FROM webhooks.endpoints")
    denied(worker, "SELECT * FROM webhooks.alert_delivery_queue")
    denied(worker, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
                   " VALUES (%s, 'x', '{}')", (endpoint,))
    denied(worker, "DELETE FROM webhooks.alert_delivery_log")
    denied(worker, "ALTER TABLE webhooks.alert_delivery_queue ADD COLUMN sneaky integer")
    denied(worker, "DROP TABLE webhooks.alert_delivery_log")
    denied(worker, "SELECT webhooks.replay(%s)", (foreign,))
    denied(worker, "SELECT webhooks.disable_endpoint(%s, 'x')", (endpoint,))
    denied(worker, "CREATE TABLE webhooks.sneaky (id int)")

    # an attempt in the audit log, for the reader to see (no worker runs here)
    query(db, "INSERT INTO webhooks.alert_delivery_log (delivery_id, webhook_id, attempt, outcome)"
              " VALUES (%s, %s, 1, 'retry')", (foreign, endpoint))
    with psycopg.connect(reader, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM webhooks.alert_delivery_queue").fetchone()[0] >= 5
        assert conn.execute("SELECT name FROM webhooks.endpoints").fetchall()
        assert conn.execute("SELECT delivery_id, outcome FROM webhooks.alert_delivery_log").fetchall() == [
            (foreign, "retry")]
        assert conn.execute("SELECT * FROM webhooks.delivery(%s)", (foreign,)).fetchone()
    denied(reader, "SELECT url FROM webhooks.endpoints")
    denied(reader, "SELECT signing_secrets FROM webhooks.endpoints")
    denied(reader, "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
                   " VALUES (%s, 'x', '{}')", (endpoint,))
    denied(reader, "SELECT * FROM webhooks.acquire('me', 10, 60)")


def test_oversized_payloads_are_refused_at_enqueue_with_a_clear_error(db, receiver):
    endpoint = add_endpoint(db, receiver.url("/big"))
    big = json.dumps({"blob": "x" * 300_000})
    statements = [
        ("SELECT webhooks.enqueue(%s, 'alert.created', %s::jsonb)", (endpoint, big)),
        ("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload) VALUES (%s, 'a', %s)",
         (endpoint, big)),
        ("SELECT webhooks.publish('alert.created', %s::jsonb)", (big,)),
    ]
    for sql, params in statements:
        with psycopg.connect(db, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.ProgramLimitExceeded) as refused:
                conn.execute(sql, params)
            size = len('{"blob": "') + 300_000 + len('"}')  # the JSON text the receiver would get
            message = refused.value.diag.message_primary
            assert message == f"webhook payload is {size} bytes; the limit is 262144 bytes"
            assert "max_payload_bytes" in (refused.value.diag.message_hint or "")
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]  # nothing truncated

    fits = json.dumps({"blob": "x" * 200_000})
    assert query(db, "SELECT webhooks.enqueue(%s, 'alert.created', %s::jsonb)", (endpoint, fits))
    query(db, "UPDATE webhooks.delivery_config SET max_payload_bytes = 1024")
    with psycopg.connect(db, autocommit=True) as conn, pytest.raises(psycopg.errors.ProgramLimitExceeded):
        conn.execute("SELECT webhooks.enqueue(%s, 'a', %s::jsonb)", (endpoint, json.dumps({"b": "x" * 2000})))


@pytest.mark.parametrize("column, value", [("event_type", "alert\r\nX-Injected: yes"),
                                           ("event_type", "tab\there"),
                                           ("idempotency_key", "key\nwebhook-signature: v1,forged")])
def test_control_characters_in_header_bound_fields_are_refused(db, receiver, column, value):
    endpoint = add_endpoint(db, receiver.url("/x"))
    columns = {"event_type": "alert.created", "idempotency_key": "k", column: value}
    insert = ("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, idempotency_key, payload)"
              " VALUES (%s, %s, %s, '{}')")
    with (
        psycopg.connect(db, autocommit=True) as conn,
        pytest.raises(psycopg.errors.CheckViolation) as refused,
    ):
        conn.execute(insert, (endpoint, columns["event_type"], columns["idempotency_key"]))
    assert refused.value.diag.constraint_name == f"{column}_printable"


def test_non_ascii_event_types_and_keys_arrive_percent_encoded_and_signed(db, receiver, spawn):
    secret = signing.generate_secret()
    endpoint = add_endpoint(db, receiver.url("/utf8"), secret=secret)
    query(db, "SELECT webhooks.enqueue(%s, 'alerte.créée', '{\"x\": \"é\"}', 'clé-1')", (endpoint,))
    spawn(db)
    eventually(lambda: receiver.to("/utf8"), message="delivered")
    [request] = receiver.to("/utf8")
    assert request.headers["webhook-event-type"] == "alerte.cr%C3%A9%C3%A9e"
    assert request.headers["webhook-id"] == "cl%C3%A9-1"
    signing.verify(secret, request.headers, request.body)
    assert json.loads(request.body) == {"x": "é"}
    # the secret that signed it is stored sealed, bound to this endpoint, under the suite's key
    [(stored,)] = query(db, "SELECT signing_secrets FROM webhooks.endpoints WHERE id = %s", (endpoint,))
    assert secret not in json.dumps(stored)
    [sealed] = [entry["secret"] for entry in stored]
    assert TEST_KEYRING.is_bound(sealed, SIGNING_SECRET, endpoint)
    assert TEST_KEYRING.open(sealed, SIGNING_SECRET, endpoint) == secret


def test_no_function_of_the_schema_is_executable_by_everyone_even_one_a_later_migration_adds(db):
    public_functions = ("SELECT count(*) FROM pg_proc p,"
                        " aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a"
                        " WHERE p.pronamespace = 'webhooks'::regnamespace AND a.grantee = 0")
    assert query(db, public_functions) == [(0,)]
    query(db, "CREATE FUNCTION webhooks.added_later() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    assert query(db, public_functions) == [(1,)]  # PostgreSQL's default for a new function
    schema.migrate(db)  # as after any migration
    assert query(db, public_functions) == [(0,)]


def test_a_producer_cannot_borrow_the_owners_rights_through_the_fan_out_trigger(db, receiver):
    endpoint = add_endpoint(db, receiver.url("/victim"))
    producer = login_as(db, PRODUCER_LOGIN, "webhooks_producer")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA app AUTHORIZATION {PRODUCER_LOGIN}")
    # a cast of the producer's own that to_jsonb(NEW) runs while the trigger converts the row
    with psycopg.connect(producer, autocommit=True) as conn:
        conn.execute("CREATE TYPE app.mood AS ENUM ('evil')")
        conn.execute("CREATE FUNCTION app.mood_json(app.mood) RETURNS json LANGUAGE plpgsql AS $$ BEGIN"
                     " UPDATE webhooks.endpoints SET url = 'https://attacker.example/steal';"
                     " RETURN '{}'; END $$")
        conn.execute("CREATE CAST (app.mood AS json) WITH FUNCTION app.mood_json(app.mood)")
        conn.execute("CREATE TABLE app.moods (id int, m app.mood)")
        conn.execute("CREATE TRIGGER fan_out AFTER INSERT ON app.moods FOR EACH ROW"
                     " EXECUTE FUNCTION webhooks.observer_queue_alert('mood.changed')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO app.moods VALUES (1, 'evil')")
        # reserved operational event types cannot be forged either
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="reserved"):
            conn.execute("SELECT webhooks.publish('webhook.endpoint.disabled', '{\"forged\": true}')")
    [(url,)] = query(db, "SELECT url FROM webhooks.endpoints WHERE id = %s", (endpoint,))
    assert TEST_KEYRING.open(url, "url", endpoint) == receiver.url("/victim")


def test_the_readme_producer_statements_work_for_a_producer(db, receiver):
    endpoint = add_endpoint(db, receiver.url("/readme"))
    producer = login_as(db, PRODUCER_LOGIN, "webhooks_producer")
    with psycopg.connect(producer, autocommit=True) as conn:
        first = conn.execute(
            "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, idempotency_key)"
            " VALUES (%s, 'alert.created', '{\"alert_id\": 42}', 'alert-42')"
            " ON CONFLICT (webhook_id, idempotency_key) DO NOTHING RETURNING delivery_id",
            (endpoint,)).fetchall()
        again = conn.execute(
            "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload, idempotency_key)"
            " VALUES (%s, 'alert.created', '{\"alert_id\": 42}', 'alert-42')"
            " ON CONFLICT (webhook_id, idempotency_key) DO NOTHING RETURNING delivery_id",
            (endpoint,)).fetchall()
    assert len(first) == 1 and again == []
