"""`keys generate`, `keys status` and `dlq list --since/--until` as an operator runs them."""

import base64
import json

from tests.acceptance.test_cli import cli
from tests.support import TEST_KEYRING, TEST_KEYS, add_endpoint, enqueue, query
from worker.encryption import KEYS_ENV, Keyring, generate_key


def as_json(db, *args, keys=TEST_KEYS):
    result = cli(*args, "--json", env={"DATABASE_URL": db, KEYS_ENV: keys})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_keys_generate_prints_a_new_32_byte_key_a_keyring_accepts_without_a_database():
    first, second = (cli("keys", "generate", env={"DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
                     for _ in range(2))
    assert first.returncode == second.returncode == 0, first.stderr
    assert first.stderr == ""
    key = first.stdout.strip()
    assert first.stdout == key + "\n"  # one line, nothing else: made for $(webhook-worker keys generate)
    assert len(base64.b64decode(key, validate=True)) == 32
    assert Keyring.parse(key, KEYS_ENV).key_ids  # usable as it is
    assert key != second.stdout.strip()  # random, not derived from anything


def test_keys_status_shows_which_keys_sealed_the_stored_credentials(db):
    for name in ("one", "two"):
        add_endpoint(db, f"https://hooks.example.test/{name}", name=name)  # its URL and one secret, sealed
    status = as_json(db, "keys", "status")
    assert status == {"primary_key": TEST_KEYRING.primary_id, "held_keys": [TEST_KEYRING.primary_id],
                      "credentials_by_key": {TEST_KEYRING.primary_id: 4}, "missing_keys": [],
                      "unbound_credentials": 0}

    # a new key listed first, the old one after it: what an operator holds before `keys rotate`
    new_key = generate_key()
    new = Keyring.parse(new_key, KEYS_ENV).primary_id
    before = as_json(db, "keys", "status", keys=f"{new_key},{TEST_KEYS}")
    assert before == {"primary_key": new, "held_keys": [new, TEST_KEYRING.primary_id],
                      "credentials_by_key": {TEST_KEYRING.primary_id: 4}, "missing_keys": [],
                      "unbound_credentials": 0}
    # the text form names the same keys
    text = cli("keys", "status", env={"DATABASE_URL": db, KEYS_ENV: f"{new_key},{TEST_KEYS}"})
    assert text.returncode == 0 and new in text.stdout and TEST_KEYRING.primary_id in text.stdout

    # without the key that sealed them: exit 2, and the missing key named
    lost = cli("keys", "status", "--json", env={"DATABASE_URL": db, KEYS_ENV: new_key})
    assert lost.returncode == 2
    assert json.loads(lost.stdout)["missing_keys"] == [TEST_KEYRING.primary_id]
    assert TEST_KEYRING.primary_id in lost.stderr


def test_dlq_list_since_is_inclusive_and_until_exclusive(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", name="dlq")
    ids = enqueue(db, endpoint, count=4)
    at = {"10:00": ids[0], "11:00": ids[1], "12:00": ids[2]}
    for time_of_day, delivery in at.items():
        query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter',"
                  " dead_letter_reason = 'test', failure_category = 'http_4xx',"
                  " dead_lettered_at = %s::timestamptz WHERE delivery_id = %s",
              (f"2026-01-01 {time_of_day}+00", delivery))

    def listed(*window):
        return [r["delivery_id"] for r in as_json(db, "dlq", "list", *window)]

    assert listed() == [ids[0], ids[1], ids[2]]  # not the row still pending
    assert listed("--since", "2026-01-01T11:00:00Z") == [ids[1], ids[2]]
    assert listed("--until", "2026-01-01T12:00:00Z") == [ids[0], ids[1]]
    assert listed("--since", "2026-01-01 11:00+00", "--until", "2026-01-01 12:00+00") == [ids[1]]
    assert listed("--since", "2026-01-01T12:00:01Z") == []
    # an offset is honoured: 12:30 at UTC+1 is 11:30 UTC
    assert listed("--until", "2026-01-01T12:30:00+01:00") == [ids[0], ids[1]]


def test_dlq_list_takes_a_time_ago_and_names_the_option_it_cannot_read(db):
    endpoint = add_endpoint(db, "http://127.0.0.1:9/x", name="dlq-ago")
    recent, old = enqueue(db, endpoint, count=2)
    query(db, "UPDATE webhooks.alert_delivery_queue SET status = 'dead_letter', dead_letter_reason = 'test',"
              " failure_category = 'http_4xx', dead_lettered_at = now() - make_interval(mins => m)"
              " FROM (VALUES (%s::bigint, 10), (%s::bigint, 120)) v(id, m) WHERE delivery_id = v.id",
          (recent, old))
    for since in ("1 hour ago", "90 minutes"):
        assert [r["delivery_id"] for r in as_json(db, "dlq", "list", "--since", since)] == [recent]
    for option in ("--since", "--until"):
        result = cli("dlq", "list", option, "notatime", env={"DATABASE_URL": db})
        assert result.returncode == 2
        assert result.stderr.strip() == (f"webhook-worker: {option}: 'notatime' is neither a timestamp nor"
                                         " a time ago such as '1 hour ago'")
