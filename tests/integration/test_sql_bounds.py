"""Input bounds in SQL: reserved event types, traceparent, sizes, caller-controlled arguments;
signing secrets."""

import base64
import json

import psycopg
import pytest
from pydantic import ValidationError

from tests.support import PRODUCER_LOGIN, TEST_KEYRING, add_endpoint, enqueue, login_as, query, worker_dsn
from tests.unit.test_signing import ACCEPTED_SECRETS, REFUSED_SECRETS
from worker import encryption
from worker.config import MAX_CLAIM_BATCH_SIZE, MAX_LEASE_SECONDS, DeliveryConfig
from worker.rules import signing

VALID_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
INSERT = ("INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload{extra})"
          " VALUES (%s, %s, '{{}}'{marks})")


def producer_dsn(db):
    return login_as(db, PRODUCER_LOGIN, "webhooks_producer")


def insert(dsn, endpoint, event_type="alert.created", **columns):
    sql = INSERT.format(extra="".join(f", {c}" for c in columns), marks=", %s" * len(columns))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql, (endpoint, event_type, *columns.values()))


def refused(dsn, error, sql, params=None):
    with psycopg.connect(dsn, autocommit=True) as conn, pytest.raises(error) as raised:
        conn.execute(sql, params)
    return raised.value


# --- 1. reserved event types ------------------------------------------------------------------------

def test_a_producer_cannot_queue_a_reserved_event_type_by_any_way_in(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    producer = producer_dsn(db)
    forged = "webhook.endpoint.disabled"
    ways_in = [
        (INSERT.format(extra="", marks=""), (endpoint, forged)),
        (INSERT.format(extra=", idempotency_key", marks=", 'k'")
         + " ON CONFLICT (webhook_id, idempotency_key) DO NOTHING RETURNING delivery_id", (endpoint, forged)),
        ("SELECT webhooks.enqueue(%s, %s, '{}')", (endpoint, forged)),
        ("SELECT webhooks.publish(%s, '{}')", (forged,)),
    ]
    for sql, params in ways_in:
        error = refused(producer, psycopg.errors.InsufficientPrivilege, sql, params)
        assert error.diag.message_primary.startswith(f"event type {forged} is reserved"), sql
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]
    # not a prefix match on 'webhook' alone: the producer's own types that merely look alike pass
    insert(producer, endpoint, "webhooks.custom")
    insert(producer, endpoint, "webhook")
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(2,)]


def test_the_schema_owner_s_operational_events_still_reach_their_subscribers(db):
    # The owner's functions queue them whoever calls: here a worker's finish() as webhooks_worker.
    failing = add_endpoint(db, "http://127.0.0.1:9/a", name="failing")
    ops = add_endpoint(db, "http://127.0.0.1:9/ops", name="ops", event_types=("webhook.endpoint.*",))
    query(db, "UPDATE webhooks.delivery_config SET dead_letter_alert_threshold = 1")
    enqueue(db, failing)
    with psycopg.connect(worker_dsn(db), autocommit=True) as conn:
        [(delivery_id, token, attempt)] = conn.execute(
            "SELECT delivery_id, lease_token, attempt FROM webhooks.acquire('w', 10, 30)").fetchall()
        conn.execute("SELECT * FROM webhooks.finish('w', %s)", (json.dumps([{
            "delivery_id": delivery_id, "lease_token": str(token), "attempt": attempt,
            "outcome": "dead_letter", "http_status": 400, "failure_category": "http_4xx"}]),))
    # and by the operator (the schema owner) directly
    query(db, "SELECT webhooks.disable_endpoint(%s, 'maintenance')", (failing,))
    queued = query(db, "SELECT webhook_id, event_type FROM webhooks.alert_delivery_queue"
                       " WHERE event_type LIKE 'webhook.%%' ORDER BY delivery_id")
    assert queued == [(ops, "webhook.endpoint.dead_letters"), (ops, "webhook.endpoint.disabled")]
    # the owner may also queue one by hand, or the operator CLI's test event through enqueue()
    insert(db, ops, "webhook.endpoint.enabled")
    assert query(db, "SELECT webhooks.enqueue(%s, 'webhook.test', '{}')", (ops,))


# --- 2. traceparent ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    pytest.param("00-abc\r\nX-Evil: 1", id="header-injection"),
    pytest.param("0" * 20_000, id="20-KB"),
    pytest.param(VALID_TRACEPARENT.upper(), id="uppercase"),
    pytest.param(VALID_TRACEPARENT + "\n", id="trailing-newline"),
    pytest.param(VALID_TRACEPARENT[:-1], id="54-characters"),
    pytest.param("00-" + "0" * 32 + "-00f067aa0ba902b7-01", id="zero-trace-id"),
    pytest.param("00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01", id="zero-parent-id"),
    pytest.param("ff" + VALID_TRACEPARENT[2:], id="version-ff"),
])
def test_a_traceparent_that_is_not_a_w3c_trace_context_is_refused_naming_the_column(db, value):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    producer = producer_dsn(db)
    for sql in (INSERT.format(extra=", traceparent", marks=", %s"),
                "SELECT webhooks.enqueue(%s, %s, '{}', p_traceparent => %s)"):
        error = refused(producer, psycopg.errors.CheckViolation, sql, (endpoint, "alert.created", value))
        assert error.diag.constraint_name == "traceparent_w3c_format"
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(0,)]


def test_a_w3c_traceparent_is_accepted(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    insert(producer_dsn(db), endpoint, traceparent=VALID_TRACEPARENT)
    assert query(db, "SELECT traceparent FROM webhooks.alert_delivery_queue") == [(VALID_TRACEPARENT,)]


# --- 6. sizes and caller-controlled arguments -------------------------------------------------------

@pytest.mark.parametrize("column, fits, too_big, limit", [
    ("metadata", json.dumps({"m": "x" * 60_000}), json.dumps({"m": "x" * 5_000_000}), 65536),
    ("source_ref", "r" * 4096, "r" * 1_000_000, 4096),
])
def test_metadata_and_source_ref_are_bounded_for_a_producer(db, column, fits, too_big, limit):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    producer = producer_dsn(db)
    argument = {"metadata": "p_metadata => %s::jsonb", "source_ref": "p_source_ref => %s"}[column]
    for sql in (INSERT.format(extra=f", {column}", marks=", %s"),
                f"SELECT webhooks.enqueue(%s, %s, '{{}}', {argument})"):
        error = refused(producer, psycopg.errors.ProgramLimitExceeded, sql,
                        (endpoint, "alert.created", too_big))
        assert error.diag.message_primary.startswith(f"webhook {column} is ")
        assert error.diag.message_primary.endswith(f"the limit is {limit} bytes")
    insert(producer, endpoint, **{column: fits})
    assert query(db, "SELECT count(*) FROM webhooks.alert_delivery_queue") == [(1,)]


def test_publish_bounds_source_ref_too(db):
    add_endpoint(db, "http://127.0.0.1:9/x")
    error = refused(producer_dsn(db), psycopg.errors.ProgramLimitExceeded,
                    "SELECT webhooks.publish('alert.created', '{}', p_source_ref => %s)", ("r" * 5000,))
    assert error.diag.message_primary == "webhook source_ref is 5000 bytes; the limit is 4096 bytes"


def test_a_worker_cannot_claim_unbounded_batches_or_leases(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    enqueue(db, endpoint)
    worker = worker_dsn(db)
    for batch, lease, argument, bounds in [
        (1_000_000, 60, "p_batch_size", "between 1 and 10000, not 1000000"),
        (0, 60, "p_batch_size", "between 1 and 10000, not 0"),
        (10, 2_000_000_000, "p_lease_seconds", "between 1 and 3600, not 2000000000"),
        (10, 0, "p_lease_seconds", "between 1 and 3600, not 0"),
    ]:
        error = refused(worker, psycopg.errors.InvalidParameterValue,
                        "SELECT * FROM webhooks.acquire('x', %s, %s)", (batch, lease))
        assert error.diag.message_primary == f"acquire: {argument} must be {bounds}"
    assert query(db, "SELECT status FROM webhooks.alert_delivery_queue") == [("pending",)]
    # the largest values the worker's configuration allows are accepted
    with psycopg.connect(worker, autocommit=True) as conn:
        claimed = conn.execute("SELECT locked_until - now() FROM webhooks.acquire('x', %s, %s)",
                               (MAX_CLAIM_BATCH_SIZE, MAX_LEASE_SECONDS)).fetchall()
    assert [c[0].total_seconds() for c in claimed] == [MAX_LEASE_SECONDS]


def test_the_worker_configuration_refuses_what_acquire_would_refuse():
    DeliveryConfig(lease_seconds=MAX_LEASE_SECONDS, claim_batch_size=MAX_CLAIM_BATCH_SIZE)
    too_large = {"lease_seconds": MAX_LEASE_SECONDS + 1, "claim_batch_size": MAX_CLAIM_BATCH_SIZE + 1}
    for key, value in too_large.items():
        with pytest.raises(ValidationError, match=key):
            DeliveryConfig(**{key: value})


def test_the_database_lease_setting_is_bounded_like_the_claim(db):
    error = refused(db, psycopg.errors.CheckViolation,
                    "UPDATE webhooks.delivery_config SET lease_seconds = %s", (MAX_LEASE_SECONDS + 1,))
    assert error.diag.constraint_name == "lease_seconds_bounded"


def test_log_partitions_ahead_are_bounded_for_a_worker(db):
    partitions = ("SELECT count(*) FROM pg_inherits"
                  " WHERE inhparent = 'webhooks.alert_delivery_log'::regclass")
    before = query(db, partitions)
    worker = worker_dsn(db)
    error = refused(worker, psycopg.errors.InvalidParameterValue, "SELECT webhooks.ensure_log_partitions(60)")
    assert error.diag.message_primary == "ensure_log_partitions: days_ahead must be between 0 and 31, not 60"
    assert query(db, partitions) == before
    with psycopg.connect(worker, autocommit=True) as conn:
        assert conn.execute("SELECT webhooks.ensure_log_partitions(31)").fetchone()[0] > 0


# --- signing secrets --------------------------------------------------------------------------

SECRET_CASES = [p.values[0] for p in REFUSED_SECRETS] + ACCEPTED_SECRETS


def test_sql_judges_a_plaintext_signing_secret_as_the_cli_and_the_api_do(db):
    for secret in SECRET_CASES:
        [(problem,)] = query(db, "SELECT webhooks.signing_secret_problem(%s)", (secret,))
        assert (problem is None) == (signing.secret_problem(secret) is None), (secret, problem)


def test_sql_judges_a_sealed_signing_secret_by_the_length_of_its_text(db):
    # the key is the worker side's: of a sealed secret PostgreSQL sees only how long its text is
    def sealed_passes(secret: str) -> bool:
        sealed = TEST_KEYRING.seal(secret, encryption.SIGNING_SECRET, 1)
        return query(db, "SELECT webhooks.signing_secret_problem(%s) IS NULL", (sealed,))[0][0]

    for secret in ("nope", "whsec_AA==", "whsec_", "whsec_" + "A" * 200):
        assert not sealed_passes(secret), secret
    for secret in (*ACCEPTED_SECRETS, signing.generate_secret()):
        assert sealed_passes(secret), secret
    # what it cannot tell: a 23-byte key's base64 is as long as a 24-byte key's
    assert sealed_passes("whsec_" + base64.b64encode(bytes(23)).decode())
    assert query(db, "SELECT webhooks.signing_secret_problem('enc:v1:abcd1234:%%%%')") == [
        ("sealed, but its envelope is not base64",)]


def test_every_function_storing_a_new_signing_secret_refuses_a_bad_one(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x")
    [(fresh,)] = query(db, "SELECT webhooks.register_endpoint('fresh', '', 'x', '[]')")
    for secret in ("nope", "whsec_AA=="):
        for stored in (secret, TEST_KEYRING.seal(secret, encryption.SIGNING_SECRET, endpoint)):
            as_json = json.dumps([{"secret": stored, "expires_at": None}])
            for sql, params in (
                    ("SELECT webhooks.register_endpoint('bad', '', 'x', %s)", (as_json,)),
                    ("SELECT webhooks.rotate_secret(%s, %s)", (endpoint, stored)),
                    ("SELECT webhooks.store_endpoint_credentials(%s, '', %s, '{}', '{}')", (fresh, as_json))):
                error = refused(db, psycopg.errors.InvalidParameterValue, sql, params)
                assert error.diag.message_primary.startswith("signing secret: "), sql
                assert stored not in str(error) and "AA==" not in str(error)
    counts = "SELECT id, jsonb_array_length(signing_secrets) FROM webhooks.endpoints ORDER BY id"
    assert query(db, counts) == [(endpoint, 1), (fresh, 0)]
    # re-sealing what is stored (keys rotate) is not a new secret: one stored before the rule stays
    legacy = json.dumps([{"secret": TEST_KEYRING.seal("whsec_AA==", encryption.SIGNING_SECRET, endpoint),
                          "expires_at": None}])
    query(db, "UPDATE webhooks.endpoints SET signing_secrets = %s WHERE id = %s", (legacy, endpoint))
    query(db, "SELECT webhooks.store_endpoint_credentials(%s, '', %s, '{}', '{}')", (endpoint, legacy))
