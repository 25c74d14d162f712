"""The rules checked together: a Hypothesis state machine with two tenants drives every way a delivery
is queued, reclaimed or sent, in any order, against the real processes, and after every step checks
the rules against a small model of what each tenant has.

The ways: publishes one and in batches over a `webhook-worker api` process, a producer's plain
`INSERT` and `publish()` in SQL, test events, replays one and in bulk, endpoints registered, disabled,
enabled and deleted (with and without their waiting rows), the operational events those changes
queue, purges with a short retention, and `webhook-worker` processes delivering to receivers on
127.0.0.1 that answer 2xx, 5xx, 4xx or 410, killed with SIGKILL at any step.

After every step: every message has a delivery and every delivery its message (within the message's
range of delivery ids, in its tenant); the endpoints are what the model says; each tenant's tokens see
all of its own rows and nothing of the other's; every row is one a step made. After each call: no API
path queued past its tenant's `max_queued`, and one that had room was not refused; a refused request
changed nothing. Once the workers drain: every delivery is delivered or dead-lettered, every delivered
one reached its receiver, and every row gone was delivered or purged as a dead letter.

Bounded for the suite (a fixed sequence of examples, a few of them); a longer, random run by hand:
docs/runbooks.md, "Testing the rules together".
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from psycopg.conninfo import conninfo_to_dict

from tests.api.server import Answer, ApiProcess, make_token
from tests.receiver import Receiver, Reply
from tests.support import (
    PRODUCER_LOGIN,
    STALL_SECONDS,
    WorkerProcess,
    eventually,
    login_as,
    wait_started,
    worker_dsn,
)

EXAMPLES = int(os.environ.get("WEBHOOK_STATEFUL_EXAMPLES", "3"))
STEPS = int(os.environ.get("WEBHOOK_STATEFUL_STEPS", "25"))
BY_HAND = "WEBHOOK_STATEFUL_EXAMPLES" in os.environ

TENANTS = ("acme", "globex")
EVENT_TYPES = ("order.paid", "order.refunded", "user.created", "misc.noted")
# what endpoints subscribe to; the last ones take the operational events of their tenant's endpoints
SUBSCRIPTIONS = (("*",), ("order.*",), ("user.created", "order.paid"), ("misc.*",), ("webhook.endpoint.*",),
                 ("order.*", "webhook.endpoint.*"))
QUOTAS = (None, 0, 1, 3, 6)
ANSWERS = (200, 200, 500, 400)  # what a receiver answers: mostly 2xx
MAX_ENDPOINTS = 4  # live, per tenant
# Every row ends within seconds: a failed attempt is retried once after 0.2 s, and a disabled
# endpoint's row becomes a dead letter once that window has passed (housekeeping, every second).
RETRY_DELAYS = [0.2]
MAX_ATTEMPTS = 2
TEST_EVENTS_PER_MINUTE = 10
UNFINISHED = ("pending", "retrying", "delivering")
FINAL = ("delivered", "dead_letter")
examples = itertools.count(1)
PICK = st.integers(0, 255)  # a choice among what exists then (endpoint_choice)


@dataclass
class Tenant:
    name: str
    id: int
    quota: int | None
    producer: str
    reader: str
    admin: str


@dataclass
class Endpoint:
    id: int
    tenant: str
    name: str
    path: str
    event_types: tuple[str, ...]
    active: bool = True
    deleted: bool = False
    answer: int = 200  # what its receiver answers


@dataclass
class Fixtures:
    fresh_db: Callable[[bool], str]
    pg_server: str
    receiver: Receiver
    tmp_path: Path
    spawned: list[WorkerProcess] = field(default_factory=list)


def subscribes(event_types: tuple[str, ...], event_type: str) -> bool:
    """webhooks.subscribes(): '*', the type itself, or a prefix pattern; '*' never takes webhook.*"""
    patterns = [t for t in event_types if not (t == "*" and event_type.startswith("webhook."))]
    return any(t in ("*", event_type) or (t.endswith(".*") and event_type.startswith(t[:-1]))
               for t in patterns)


def judged(quota: int | None, needs: list[int], free: int) -> tuple[str, ...]:
    """The gate's quota rule: messages in order while they fit in the free room; from the first that does
    not, every later one too; one needing more than the quota itself never fits and stops nothing."""
    out: list[str] = []
    used, stopped = 0, False
    for need in needs:
        if quota is None:
            out.append("ok")
        elif need > quota:
            out.append("never")
        elif stopped or (need > 0 and used + need > free):
            stopped = True
            out.append("full")
        else:
            used += need
            out.append("ok")
    return tuple(out)


class RulesTogether(RuleBasedStateMachine):
    def __init__(self, fixtures: Fixtures) -> None:
        super().__init__()
        self.fx = fixtures
        self.example = next(examples)
        self.dsn = fixtures.fresh_db(True)
        self.owner = psycopg.connect(self.dsn, autocommit=True)
        self.producer_sql = psycopg.connect(login_as(self.dsn, PRODUCER_LOGIN, "webhooks_producer"),
                                            autocommit=True)
        self.worker_sql = psycopg.connect(worker_dsn(self.dsn), autocommit=True)
        # no circuit opens and no dead-letter notice is sent: what is asserted is the gate and the reclaim;
        # delivered rows are purged a second after, so the reclaim runs beside every other step
        self.sql("UPDATE webhooks.delivery_config SET circuit_min_attempts = 1000000,"
                 " dead_letter_alert_threshold = 1000000, delivered_retention = interval '1 second'")
        self.workdir = fixtures.tmp_path / f"example-{self.example}"
        self.workdir.mkdir()
        self.api = ApiProcess(self.dsn, self.workdir)
        self.http = self.api.client
        self.admin = make_token(self.dsn, "admin")
        self.tenants: dict[str, Tenant] = {}
        self.endpoints: dict[int, Endpoint] = {}
        self.workers: list[WorkerProcess] = []
        self.worker_names = itertools.count(1)
        self.made: dict[int, str] = {}  # every delivery a step made: its tenant
        self.high = 0  # the highest delivery id made so far
        self.high_message = 0
        self.dead_purged: set[int] = set()  # rows an operator's purge of dead letters may have taken
        self.test_sends: dict[int, list[tuple[float, float]]] = {}  # accepted test events: (asked, answered)
        self.names = itertools.count(1)
        self.start_worker()

    # --- helpers -------------------------------------------------------------------------------------

    def sql(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = self.owner.execute(sql, params)
        return cur.fetchall() if cur.description is not None else []

    def live(self, tenant: str | None = None) -> list[Endpoint]:
        return [e for e in self.endpoints.values() if not e.deleted and tenant in (None, e.tenant)]

    def unfinished(self, tenant: str) -> int:
        return int(self.sql("SELECT count(*) FROM webhooks.alert_delivery_queue WHERE tenant_id = %s"
                            " AND status = ANY(%s)", (self.tenants[tenant].id, list(UNFINISHED)))[0][0])

    def targets(self, tenant: str, event_type: str, exclude: int | None = None
                ) -> tuple[list[int], list[int]]:
        """A fan-out in the tenant: its enabled subscribers, or, when it has none, its disabled ones,
        kept as dead letters (category disabled)."""
        subscribers = [e for e in self.live(tenant)
                       if e.id != exclude and subscribes(e.event_types, event_type)]
        active = sorted(e.id for e in subscribers if e.active)
        return (active, []) if active else ([], sorted(e.id for e in subscribers))

    def refusal_state(self) -> dict[str, Any]:
        """What a refused request must leave as it was (the workers change the rest)."""
        return {
            "endpoints": self.sql("SELECT id, name, tenant_id, active, event_types FROM webhooks.endpoints"
                                  " ORDER BY id"),
            "deleted": self.sql("SELECT id FROM webhooks.deleted_endpoints ORDER BY id"),
            "new rows": self.sql("SELECT delivery_id FROM webhooks.alert_delivery_queue"
                                 " WHERE delivery_id > %s"
                                 " UNION SELECT delivery_id FROM webhooks.alert_delivery_log"
                                 " WHERE delivery_id > %s", (self.high, self.high)),
            "new messages": self.sql("SELECT message_id FROM webhooks.messages WHERE message_id > %s",
                                     (self.high_message,)),
            "replays and drops": self.sql("SELECT count(*) FILTER (WHERE outcome = 'replayed'),"
                                          " count(*) FILTER (WHERE failure_category = 'endpoint_deleted')"
                                          " FROM webhooks.alert_delivery_log"),
            "test sends": self.sql("SELECT webhook_id, sent_at FROM webhooks.test_event_sends ORDER BY 1"),
            "tenants": self.sql("SELECT id, name, max_queued FROM webhooks.tenants ORDER BY id"),
            "operations": self.sql("SELECT count(*) FROM webhooks.api_operations"),
            "endpoint events": self.sql("SELECT count(*) FROM webhooks.endpoint_events"),
        }

    def refused(self, before: dict[str, Any], answer: Answer, what: str) -> None:
        assert self.refusal_state() == before, (
            f"{what}: refused with {answer.status} and yet changed something")

    def new_rows(self) -> dict[int, tuple[int, int, str, str | None, str | None]]:
        """The rows made since the last look: id → (endpoint, tenant id, status, category, event type),
        each recorded as made, in its endpoint's tenant. One delivered and purged already (a short
        retention) is found by its audit rows, with status `purged`."""
        rows = self.sql("SELECT delivery_id, webhook_id, tenant_id, status, failure_category, event_type"
                        " FROM webhooks.alert_delivery_queue WHERE delivery_id > %s"
                        " UNION ALL"
                        " SELECT DISTINCT l.delivery_id, l.webhook_id, l.tenant_id, 'purged', NULL, NULL"
                        " FROM webhooks.alert_delivery_log l WHERE l.delivery_id > %s AND NOT EXISTS ("
                        "     SELECT 1 FROM webhooks.alert_delivery_queue q"
                        "     WHERE q.delivery_id = l.delivery_id)"
                        " ORDER BY 1", (self.high, self.high))
        found = {r[0]: r[1:] for r in rows}
        tenant_names = {t.id: t.name for t in self.tenants.values()}
        for delivery_id, (endpoint, tenant_id, status, *_) in found.items():
            assert self.endpoints[endpoint].tenant == tenant_names[tenant_id], f"row {delivery_id}: tenant"
            assert status != "purged" or self.was_delivered(delivery_id), (
                f"row {delivery_id} gone, not delivered")
            self.made[delivery_id] = tenant_names[tenant_id]
        self.high = max([self.high, *found])
        [(message,)] = self.sql("SELECT max(message_id) FROM webhooks.messages")
        self.high_message = max(self.high_message, message or 0)
        return found

    def made_as(self, answered: dict[int, int], found: dict[int, tuple[Any, ...]]) -> None:
        """The rows a call made are the ones it answered with (delivery → endpoint)."""
        assert {i: r[0] for i, r in found.items()} == answered, (found, answered)

    def was_delivered(self, delivery_id: int) -> bool:
        [(last,)] = self.sql("SELECT (SELECT outcome FROM webhooks.alert_delivery_log WHERE delivery_id = %s"
                             " ORDER BY logged_at DESC LIMIT 1)", (delivery_id,))
        return bool(last == "delivered")

    def check_rows(self, found: dict[int, tuple[Any, ...]], active: list[int], kept: list[int],
                   event_type: str | None = None) -> None:
        """Rows of one message: one per target; those kept for disabled subscribers are dead letters."""
        for endpoint, status, category, kind in ((r[0], r[2], r[3], r[4]) for r in found.values()):
            if event_type is not None and kind is not None:
                assert kind == event_type
            if endpoint in kept:
                assert (status, category) == ("dead_letter", "disabled"), (endpoint, status, category)
            else:
                assert endpoint in active, (endpoint, active, kept)

    def quota_outcomes(self, tenant: str, needs: list[int], before: int, after: int, created: int
                       ) -> set[tuple[str, ...]]:
        """Every answer the quota rule allows: the tenant's unfinished rows when the gate counted them lie
        between `after` less what the call made and `before` (the workers only end rows meanwhile)."""
        quota = self.tenants[tenant].quota
        if quota is None:
            return {judged(None, needs, 0)}
        return {judged(quota, needs, quota - counted)
                for counted in range(max(0, after - created), before + 1)}

    def ensure_worker(self) -> None:
        if not self.workers:
            self.start_worker()

    def endpoint_choice(self, pick: int, tenant: str, deleted: bool = True) -> Endpoint | None:
        """One of the tenant's endpoints (deleted ones too, unless told), by a drawn number: what is drawn
        never depends on what the processes did, so a sequence of steps runs again as it ran."""
        choices = [e for e in self.endpoints.values() if e.tenant == tenant and (deleted or not e.deleted)]
        return sorted(choices, key=lambda e: e.id)[pick % len(choices)] if choices else None

    # --- set-up --------------------------------------------------------------------------------------

    @initialize(quotas=st.tuples(st.sampled_from(QUOTAS), st.sampled_from(QUOTAS)),
                subscriptions=st.lists(st.sampled_from(SUBSCRIPTIONS), min_size=4, max_size=4),
                answers=st.lists(st.sampled_from(ANSWERS), min_size=4, max_size=4))
    def two_tenants(self, quotas: tuple[int | None, int | None],
                    subscriptions: list[tuple[str, ...]], answers: list[int]) -> None:
        for name, quota in zip(TENANTS, quotas, strict=True):
            made = self.http.post("/v1/tenants", self.admin, {"name": name, "max_queued": quota,
                                                              "allow_networks": ["127.0.0.1/32"]})
            assert made.status == 201, made.body
            self.tenants[name] = Tenant(name, made.json["id"], quota,
                                        *(make_token(self.dsn, role, tenant=name)
                                          for role in ("producer", "reader", "tenant_admin")))
        # the same names in both tenants: a name is its tenant's
        # and their receivers answer as drawn, so a message's deliveries end apart from the start
        for n, (event_types, status) in enumerate(zip(subscriptions, answers, strict=True)):
            self.set_answer(self.register(TENANTS[n % 2], "ab"[n // 2], event_types), status)

    def register(self, tenant: str, name: str, event_types: tuple[str, ...]) -> Endpoint:
        path = f"/example-{self.example}/{tenant}/{name}-{next(self.names)}"
        made = self.http.post("/v1/endpoints", self.tenants[tenant].admin, {
            "name": name, "url": self.fx.receiver.url(path), "event_types": list(event_types),
            "retry_delays": RETRY_DELAYS, "max_attempts": MAX_ATTEMPTS, "max_in_flight": 100})
        assert made.status == 201, made.body
        endpoint = Endpoint(made.json["id"], tenant, name, path, event_types)
        self.endpoints[endpoint.id] = endpoint
        self.fx.receiver.script(path, Reply(200))
        return endpoint

    # --- publishing ----------------------------------------------------------------------------------

    @rule(pick=PICK, tenant=st.sampled_from(TENANTS), event_type=st.sampled_from(EVENT_TYPES),
          addressed=st.booleans())
    def publish(self, pick: int, tenant: str, event_type: str, addressed: bool) -> None:
        """POST /v1/messages: to the tenant's subscribers, or to one endpoint it names."""
        body: dict[str, Any] = {"event_type": event_type, "payload": {"step": "publish"}}
        endpoint = self.endpoint_choice(pick, tenant) if addressed else None
        if endpoint is not None:
            body["endpoint"] = endpoint.name
        state, before = self.refusal_state(), self.unfinished(tenant)
        answer = self.http.post("/v1/messages", self.tenants[tenant].producer, body)
        found = self.new_rows()
        if endpoint is not None and endpoint.name not in {e.name for e in self.live(tenant)}:
            assert answer.status == 422 and answer.json["field"] == "endpoint", answer.body
            return self.refused(state, answer, "a publish to a deleted endpoint")
        if endpoint is not None:
            endpoint = next(e for e in self.live(tenant) if e.name == endpoint.name)
            active, kept = [endpoint.id], list[int]()
        else:
            active, kept = self.targets(tenant, event_type)
        self.judge_publish(tenant, answer, state, before, found, active, kept, event_type)

    def judge_publish(self, tenant: str, answer: Answer, state: dict[str, Any], before: int,
                      found: dict[int, tuple[Any, ...]], active: list[int], kept: list[int],
                      event_type: str) -> None:
        after = self.unfinished(tenant)
        allowed = self.quota_outcomes(tenant, [len(active)], before, after, len(found))
        verdict = "ok" if answer.status == 202 else "never" if answer.status == 429 and "can never" in (
            answer.json.get("detail", "")) else "full" if answer.status == 429 else f"status {answer.status}"
        assert (verdict,) in allowed, (
            f"{tenant} (max_queued {self.tenants[tenant].quota}, {before} unfinished before, {after} after)"
            f" needing {len(active)}: {answer.status} {answer.body!r}")
        if verdict != "ok":
            assert ("retry-after" in answer.headers) == (verdict == "full"), answer.headers
            return self.refused(state, answer, "a publish past the quota")
        # a publish answers its deliveries, a test event its one
        deliveries = answer.json.get("deliveries", [answer.json])
        answered = {d["delivery_id"]: d["endpoint_id"] for d in deliveries}
        assert sorted(answered.values()) == sorted(active + kept), (answer.body, active, kept)
        self.made_as(answered, found)
        self.check_rows(found, active, kept, event_type)
        quota = self.tenants[tenant].quota
        assert quota is None or not active or after <= quota, (
            f"{tenant}: {after} unfinished, max_queued {quota}")

    @rule(tenant=st.sampled_from(TENANTS),
          messages=st.lists(st.tuples(st.sampled_from(("valid", "valid", "addressed", "malformed")),
                                      st.sampled_from(EVENT_TYPES), PICK), min_size=1, max_size=4))
    def publish_batch(self, tenant: str, messages: list[tuple[str, str, int]]) -> None:
        """POST /v1/messages/batch: each message judged alone, queued in order while it fits."""
        body: list[dict[str, Any]] = []
        expected: list[tuple[list[int], list[int]] | None] = []  # (active, kept) per message, None: malformed
        for kind, event_type, pick in messages:
            if kind == "malformed":
                body.append({"event_type": event_type, "payload": {}, "colour": "red"})
                expected.append(None)
                continue
            message: dict[str, Any] = {"event_type": event_type, "payload": {"step": "batch"}}
            endpoint = self.endpoint_choice(pick, tenant) if kind == "addressed" else None
            if endpoint is not None:
                message["endpoint"] = endpoint.name
                named = [e for e in self.live(tenant) if e.name == endpoint.name]
                expected.append(([named[0].id], []) if named else None)
            else:
                expected.append(self.targets(tenant, event_type))
            body.append(message)
        state, before = self.refusal_state(), self.unfinished(tenant)
        answer = self.http.post("/v1/messages/batch", self.tenants[tenant].producer, {"messages": body})
        found = self.new_rows()
        after = self.unfinished(tenant)
        assert answer.status in (200, 202), answer.body
        results = answer.json["results"]
        assert len(results) == len(body)
        for n, (result, targets) in enumerate(zip(results, expected, strict=True)):
            if targets is None:
                assert (result["status"], result["index"]) == (422, n), result
        judged_ones = [(n, t) for n, t in enumerate(expected) if t is not None]
        verdicts = tuple("ok" if "deliveries" in results[n] else
                         "never" if "can never" in results[n].get("detail", "") else
                         "full" if results[n].get("status") == 429 else f"status {results[n].get('status')}"
                         for n, _ in judged_ones)
        allowed = self.quota_outcomes(tenant, [len(t[0]) for _, t in judged_ones], before, after, len(found))
        assert verdicts in allowed, (f"{tenant} (max_queued {self.tenants[tenant].quota}, {before} unfinished"
                                     f" before, {after} after): {verdicts} not in {allowed}")
        assert ("retry-after" in answer.headers) == ("full" in verdicts), answer.headers
        answered: dict[int, int] = {}
        for (n, (active, kept)), verdict in zip(judged_ones, verdicts, strict=True):
            if verdict != "ok":
                assert results[n]["index"] == n
                continue
            mine = {d["delivery_id"]: d["endpoint_id"] for d in results[n]["deliveries"]}
            assert sorted(mine.values()) == sorted(active + kept), (results[n], active, kept)
            self.check_rows({i: r for i, r in found.items() if i in mine}, active, kept,
                            str(body[n]["event_type"]))
            answered |= mine
        self.made_as(answered, found)
        assert (answer.status == 202) == bool(answered), answer.status
        if not answered:
            self.refused(state, answer, "a batch of which nothing was queued")
        quota = self.tenants[tenant].quota
        assert quota is None or not found or after <= quota, (
            f"{tenant}: {after} unfinished, max_queued {quota}")

    @rule(pick=PICK, tenant=st.sampled_from(TENANTS), event_type=st.sampled_from(EVENT_TYPES))
    def insert_in_sql(self, pick: int, tenant: str, event_type: str) -> None:
        """A producer's plain INSERT: to one endpoint, never refused for a quota."""
        endpoint = self.endpoint_choice(pick, tenant)
        if endpoint is None:
            return
        state = self.refusal_state()
        try:
            [(delivery_id,)] = self.producer_sql.execute(
                "INSERT INTO webhooks.alert_delivery_queue (webhook_id, event_type, payload)"
                " VALUES (%s, %s, '{\"step\": \"insert\"}') RETURNING delivery_id", (endpoint.id, event_type)
            ).fetchall()
        except psycopg.errors.ForeignKeyViolation:
            assert endpoint.deleted, f"an INSERT for live endpoint {endpoint.id} refused"
            assert self.refusal_state() == state, "a refused INSERT changed something"
            return
        assert not endpoint.deleted, "a row queued for a deleted endpoint"
        found = self.new_rows()
        self.made_as({delivery_id: endpoint.id}, found)

    @rule(event_type=st.sampled_from(EVENT_TYPES))
    def publish_in_sql(self, event_type: str) -> None:
        """A producer's publish() in SQL, no tenant's: every tenant's subscribers, each judged alone."""
        [(count,)] = self.producer_sql.execute("SELECT webhooks.publish(%s, '{\"step\": \"sql\"}')",
                                               (event_type,)).fetchall()
        found = self.new_rows()
        expected = {tenant: self.targets(tenant, event_type) for tenant in TENANTS}
        assert count == sum(len(a) + len(k) for a, k in expected.values())
        for tenant, (active, kept) in expected.items():
            mine = {i: r for i, r in found.items() if self.made[i] == tenant}
            assert sorted(r[0] for r in mine.values()) == sorted(active + kept), (tenant, mine, active, kept)
            self.check_rows(mine, active, kept, event_type)

    # --- test events ---------------------------------------------------------------------------------

    @rule(pick=PICK, tenant=st.sampled_from(TENANTS), times=st.integers(1, 6))
    def test_events(self, pick: int, tenant: str, times: int) -> None:
        """POST /v1/endpoints/{id}/test: refused to a disabled endpoint, 10 a minute per endpoint, held to
        the tenant's quota."""
        endpoint = self.endpoint_choice(pick, tenant)
        if endpoint is None:
            return
        for _ in range(times):
            state, before = self.refusal_state(), self.unfinished(tenant)
            sent = self.test_sends.setdefault(endpoint.id, [])
            asked = time.monotonic()
            answer = self.http.post(f"/v1/endpoints/{endpoint.id}/test", self.tenants[tenant].admin)
            answered = time.monotonic()
            found = self.new_rows()
            if endpoint.deleted:
                assert answer.status == 404, answer.body
                return self.refused(state, answer, "a test event to a deleted endpoint")
            if not endpoint.active:
                assert answer.status == 409, answer.body
                assert "the endpoint is disabled" in answer.json["detail"], answer.body
                return self.refused(state, answer, "a test event to a disabled endpoint")
            # those surely within the minute the database counts, and those that may be
            surely = sum(1 for a, _ in sent if answered - a < 59)
            maybe = sum(1 for _, b in sent if asked - b < 61)
            if answer.status == 429 and "test events a minute" in answer.json["detail"]:
                assert maybe >= TEST_EVENTS_PER_MINUTE, (sent, asked)
                assert 1 <= int(answer.headers["retry-after"]) <= 60
                self.refused(state, answer, "a test event past the rate")
                continue
            assert surely < TEST_EVENTS_PER_MINUTE, (answer.body, sent, asked)
            self.judge_publish(tenant, answer, state, before, found, [endpoint.id], [], "webhook.test")
            if answer.status == 202:
                sent.append((asked, answered))

    # --- replays -------------------------------------------------------------------------------------

    @rule(pick=PICK, tenant=st.sampled_from(TENANTS), whose=st.sampled_from(("own", "own", "other")))
    def replay_one(self, pick: int, tenant: str, whose: str) -> None:
        """POST /v1/deliveries/{id}/replay: a dead letter or delivered row of the tenant comes back; a row
        not final, or of a deleted endpoint, is refused; another tenant's is not found."""
        owner = tenant if whose == "own" else next(t for t in TENANTS if t != tenant)
        rows = self.sql("SELECT delivery_id FROM webhooks.alert_delivery_queue WHERE tenant_id = %s"
                        " ORDER BY 1", (self.tenants[owner].id,))
        if not rows:
            return
        [delivery_id] = rows[pick % len(rows)]
        state = self.refusal_state()
        row = self.sql("SELECT q.status, q.replays, e.id IS NULL FROM webhooks.alert_delivery_queue q"
                       " LEFT JOIN webhooks.endpoints e ON e.id = q.webhook_id WHERE q.delivery_id = %s",
                       (delivery_id,))
        answer = self.http.post(f"/v1/deliveries/{delivery_id}/replay", self.tenants[tenant].admin)
        self.new_rows()
        if owner != tenant:
            assert answer.status == 404, answer.body
            return self.refused(state, answer, "a replay of another tenant's row")
        if not row:  # purged meanwhile (a delivered row past its retention)
            assert answer.status == 404, answer.body
            return None
        status, replays, deleted = row[0]
        after = self.sql("SELECT status, replays FROM webhooks.alert_delivery_queue WHERE delivery_id = %s",
                         (delivery_id,))
        if deleted:
            assert answer.status == 409 and "deleted" in answer.json["detail"], answer.body
            return self.refused(state, answer, "a replay of a deleted endpoint's row")
        if answer.status == 404:
            assert status == "delivered" and not after, (status, after)  # purged meanwhile
            return None
        if status in FINAL:
            assert answer.status == 202, answer.body
        if answer.status == 409:
            assert status in UNFINISHED, (status, answer.body)
            return self.refused(state, answer, "a replay of a row not final")
        assert answer.status == 202, answer.body
        assert not after or after[0][1] == replays + 1, after

    @rule(pick=PICK, tenant=st.sampled_from(TENANTS), by=st.sampled_from(("all", "endpoint", "category")),
          category=st.sampled_from(("http_5xx", "http_4xx", "disabled", "endpoint_deleted")))
    def replay_in_bulk(self, pick: int, tenant: str, by: str, category: str) -> None:
        """POST /v1/dead-letters/replay: the tenant's dead letters matching the filter when it started, of
        its live endpoints, each once; nothing of the other tenant's."""
        mine = self.tenants[tenant]
        flt: dict[str, str] = {}
        endpoint = self.endpoint_choice(pick, tenant, deleted=False)
        if by == "endpoint" and endpoint is not None:
            flt["endpoint"] = endpoint.name
        elif by == "category":
            flt["category"] = category
        replays = "SELECT delivery_id, replays FROM webhooks.alert_delivery_queue"
        before = {i: n for i, n in self.sql(replays)}
        only = endpoint.id if "endpoint" in flt and endpoint is not None else None
        dead = {r[0] for r in self.sql(
            "SELECT q.delivery_id FROM webhooks.alert_delivery_queue q"
            " JOIN webhooks.endpoints e ON e.id = q.webhook_id"
            " WHERE q.status = 'dead_letter' AND q.tenant_id = %s"
            " AND (%s::bigint IS NULL OR q.webhook_id = %s)"
            " AND (%s::text IS NULL OR q.failure_category = %s)",
            (mine.id, only, only, flt.get("category"), flt.get("category")))}
        answer = self.http.post("/v1/dead-letters/replay", mine.admin, {"filter": flt})
        assert answer.status == 202, answer.body
        operation = answer.json["id"]

        def ended() -> bool:
            status = self.http.get(f"/v1/operations/{operation}", mine.reader).json["status"]
            assert status in ("running", "done"), status
            return bool(status == "done")

        eventually(ended, message=f"operation {operation} done")
        after = {i: n for i, n in self.sql(replays)}
        replayed = {i for i, n in after.items() if n > before.get(i, n)}
        assert all(self.made[i] == tenant for i in replayed), "another tenant's rows replayed"
        assert dead <= replayed | (set(before) - set(after)), f"dead letters not replayed: {dead - replayed}"
        newly_dead = replayed - dead  # dead-lettered between the look and the start, if any
        assert all(self.made[i] == tenant for i in newly_dead)
        self.new_rows()

    # --- endpoints -----------------------------------------------------------------------------------

    @rule(pick=PICK, tenant=st.sampled_from(TENANTS), enable=st.booleans())
    def disable_or_enable(self, pick: int, tenant: str, enable: bool) -> None:
        """POST /v1/endpoints/{id}/enable|disable, which queue the change as an operational event to the
        tenant's other endpoints that subscribe to it."""
        endpoint = self.endpoint_choice(pick, tenant)
        if endpoint is None:
            return
        if enable and endpoint.answer == 410 and not endpoint.deleted:
            # its receiver is back: once its answers of 410 in flight are written, it is enabled
            self.wait_not_sending(endpoint)
            self.set_answer(endpoint, 200)
        state = self.refusal_state()
        answer = self.http.post(f"/v1/endpoints/{endpoint.id}/{'enable' if enable else 'disable'}",
                                self.tenants[tenant].admin)
        found = self.new_rows()
        if endpoint.deleted:
            assert answer.status == 404, answer.body
            return self.refused(state, answer, "a change of a deleted endpoint")
        assert answer.status == 200, answer.body
        changed = endpoint.active != enable
        assert answer.json["changed"] == changed, (answer.body, endpoint)
        endpoint.active = enable
        if changed:
            active, kept = self.targets(tenant, f"webhook.endpoint.{'enabled' if enable else 'disabled'}",
                                        exclude=endpoint.id)
            assert sorted(r[0] for r in found.values()) == sorted(active + kept), (found, active, kept)
            self.check_rows(found, active, kept)
        else:
            assert not found

    @rule(pick=PICK, tenant=st.sampled_from(TENANTS), drop_pending=st.booleans())
    def delete(self, pick: int, tenant: str, drop_pending: bool) -> None:
        """DELETE /v1/endpoints/{id}: refused while rows are waiting (unless drop_pending, which makes them
        dead letters) or being sent."""
        endpoint = self.endpoint_choice(pick, tenant)
        if endpoint is None:
            return
        rows = "SELECT status FROM webhooks.alert_delivery_queue WHERE webhook_id = %s"
        before = [r[0] for r in self.sql(rows, (endpoint.id,))]
        state = self.refusal_state()
        query = "?drop_pending=true" if drop_pending else ""
        answer = self.http.request("DELETE", f"/v1/endpoints/{endpoint.id}{query}",
                                   self.tenants[tenant].admin)
        self.new_rows()
        after = [r[0] for r in self.sql(rows, (endpoint.id,))]
        if endpoint.deleted:
            assert answer.status == 404, answer.body
            return self.refused(state, answer, "a delete of a deleted endpoint")
        if answer.status == 409:
            assert any(s in UNFINISHED for s in before), (before, answer.body)
            if not endpoint.active:
                assert "delivering" in before or not drop_pending, (before, answer.body)
            return self.refused(state, answer, "a delete of an endpoint with rows")
        assert answer.status == 204, answer.body
        assert not any(s in UNFINISHED for s in after), after
        dropped = self.sql("SELECT count(*) FROM webhooks.alert_delivery_queue WHERE webhook_id = %s"
                           " AND failure_category = 'endpoint_deleted'", (endpoint.id,))[0][0]
        assert dropped <= sum(s in UNFINISHED for s in before)
        assert drop_pending or dropped == 0
        assert self.sql("SELECT name FROM webhooks.deleted_endpoints WHERE id = %s", (endpoint.id,)) == [
            (endpoint.name,)]
        endpoint.deleted = True

    @rule(pick=PICK, tenant=st.sampled_from(TENANTS), event_types=st.sampled_from(SUBSCRIPTIONS))
    def register_endpoint(self, pick: int, tenant: str, event_types: tuple[str, ...]) -> None:
        """POST /v1/endpoints: a new endpoint, or a live name taken (409); a deleted endpoint's name is
        free."""
        names = sorted({e.name for e in self.endpoints.values() if e.tenant == tenant} | {"c", "d"})
        name = names[pick % len(names)]
        if name in {e.name for e in self.live(tenant)}:
            state = self.refusal_state()
            answer = self.http.post("/v1/endpoints", self.tenants[tenant].admin, {
                "name": name, "url": self.fx.receiver.url("/taken"), "event_types": list(event_types)})
            assert answer.status == 409 and answer.json["field"] == "name", answer.body
            return self.refused(state, answer, "an endpoint registered under a live name")
        if len(self.live(tenant)) < MAX_ENDPOINTS:
            self.register(tenant, name, event_types)
        return None

    @rule(pick=PICK, tenant=st.sampled_from(TENANTS), status=st.sampled_from(ANSWERS))
    def receiver_answers(self, pick: int, tenant: str, status: int) -> None:
        """The endpoint's receiver answers 2xx (delivered), 5xx (retried, then a dead letter) or 4xx (a dead
        letter at once) from now on."""
        endpoint = self.endpoint_choice(pick, tenant, deleted=False)
        if endpoint is not None and endpoint.answer != 410:
            self.set_answer(endpoint, status)

    @rule(pick=PICK, tenant=st.sampled_from(TENANTS))
    def receiver_gone(self, pick: int, tenant: str) -> None:
        """The receiver answers 410 Gone: its next delivery is a dead letter and the endpoint is disabled,
        which queues that change as an operational event for the tenant's subscribers to it."""
        endpoint = self.endpoint_choice(pick, tenant, deleted=False)
        if endpoint is None or not endpoint.active:
            return
        self.set_answer(endpoint, 410)
        self.producer_sql.execute("INSERT INTO webhooks.alert_delivery_queue"
                                  " (webhook_id, event_type, payload)"
                                  " VALUES (%s, 'order.paid', '{\"step\": \"gone\"}')", (endpoint.id,))
        self.new_rows()
        self.ensure_worker()
        [(reason,)] = eventually(lambda: self.sql("SELECT disabled_reason FROM webhooks.endpoints"
                                                  " WHERE id = %s AND NOT active", (endpoint.id,)),
                                 message=f"endpoint {endpoint.id} disabled by a 410")
        assert reason.startswith("HTTP 410 Gone on delivery"), reason
        endpoint.active = False
        found = self.new_rows()
        active, kept = self.targets(tenant, "webhook.endpoint.disabled", exclude=endpoint.id)
        assert sorted(r[0] for r in found.values()) == sorted(active + kept), (found, active, kept)
        self.check_rows(found, active, kept, "webhook.endpoint.disabled")

    def set_answer(self, endpoint: Endpoint, status: int) -> None:
        endpoint.answer = status
        self.fx.receiver.script(endpoint.path, Reply(status))

    def wait_not_sending(self, endpoint: Endpoint) -> None:
        eventually(lambda: not self.sql("SELECT 1 FROM webhooks.alert_delivery_queue WHERE webhook_id = %s"
                                        " AND status = 'delivering'", (endpoint.id,)),
                   message=f"endpoint {endpoint.id}'s requests in flight written")

    # --- the tenants' limits -------------------------------------------------------------------------

    @rule(tenant=st.sampled_from(TENANTS), quota=st.sampled_from(QUOTAS))
    def set_quota(self, tenant: str, quota: int | None) -> None:
        answer = self.http.request("PATCH", f"/v1/tenants/{tenant}", self.admin, {"max_queued": quota})
        assert answer.status == 200 and answer.json["max_queued"] == quota, answer.body
        self.tenants[tenant].quota = quota

    # --- retention -----------------------------------------------------------------------------------

    @rule(retention=st.sampled_from((0, 1)), dead_letters=st.booleans())
    def purge(self, retention: int, dead_letters: bool) -> None:
        """A purge now, with a retention of 0 or 1 s (the workers' housekeeping purges every second with
        it); an operator's purge of dead letters, maybe."""
        answer = self.http.request("PATCH", "/v1/config", self.admin, {"delivered_retention": retention})
        assert answer.status == 200, answer.body
        self.worker_sql.execute("SELECT * FROM webhooks.purge(1000)")
        if dead_letters:
            present = {r[0] for r in self.sql("SELECT delivery_id FROM webhooks.alert_delivery_queue")}
            self.sql("SELECT webhooks.purge_dead_letters()")
            self.dead_purged |= present - {r[0] for r in self.sql(
                "SELECT delivery_id FROM webhooks.alert_delivery_queue")}
        self.new_rows()

    # --- workers -------------------------------------------------------------------------------------

    @precondition(lambda self: len(self.workers) < 2)
    @rule()
    def start_worker(self) -> None:
        name = f"example-{self.example}-worker-{next(self.worker_names)}"
        worker = WorkerProcess(self.dsn, self.workdir, name, housekeeping={"interval_seconds": 1})
        self.fx.spawned.append(worker)
        self.workers.append(worker)
        wait_started([worker])

    @precondition(lambda self: self.workers)
    @rule(pick=PICK)
    def kill_worker(self, pick: int) -> None:
        """SIGKILL, at whatever point it is: its leases come back through another worker."""
        worker = self.workers[pick % len(self.workers)]
        worker.kill()
        self.workers.remove(worker)

    @rule()
    def drain(self) -> None:
        """The workers run until every delivery is delivered or dead-lettered."""
        self.ensure_worker()
        progress = "SELECT status, count(*) FROM webhooks.alert_delivery_queue GROUP BY 1 ORDER BY 1"
        eventually(lambda: not self.sql("SELECT 1 FROM webhooks.alert_delivery_queue WHERE status = ANY(%s)"
                                        " LIMIT 1", (list(UNFINISHED),)),
                   timeout=300, message="every delivery delivered or dead-lettered",
                   progress=lambda: (self.sql(progress), self.sql("SELECT max(logged_at)"
                                                                  " FROM webhooks.alert_delivery_log")),
                   stall=STALL_SECONDS)
        self.new_rows()
        prefix = f"/example-{self.example}/"
        received = {r.delivery_id for r in self.fx.receiver.requests if r.path.startswith(prefix)}
        delivered = {r[0] for r in self.sql("SELECT delivery_id FROM webhooks.alert_delivery_queue"
                                            " WHERE status = 'delivered'")}
        assert delivered <= received, f"delivered without a request: {delivered - received}"
        assert self.sql("SELECT delivery_id FROM webhooks.alert_delivery_queue WHERE status = 'dead_letter'"
                        " AND (dead_letter_reason IS NULL OR failure_category IS NULL)") == []
        # every row gone was delivered, or taken by an operator's purge of dead letters
        present = {r[0] for r in self.sql("SELECT delivery_id FROM webhooks.alert_delivery_queue")}
        for gone in sorted(set(self.made) - present - self.dead_purged):
            assert self.was_delivered(gone), f"delivery {gone} is gone and was never delivered"

    # --- what holds after every step -----------------------------------------------------------------

    @invariant()
    def messages_and_deliveries_point_at_each_other(self) -> None:
        [(orphans, without, outside)] = self.sql(
            "SELECT (SELECT count(*) FROM webhooks.messages m WHERE NOT EXISTS ("
            "            SELECT 1 FROM webhooks.alert_delivery_queue q WHERE q.message_id = m.message_id)),"
            "       (SELECT count(*) FROM webhooks.alert_delivery_queue q"
            "        LEFT JOIN webhooks.messages m ON m.message_id = q.message_id"
            "        WHERE m.message_id IS NULL AND (q.message_id IS NOT NULL OR q.payload IS NULL)),"
            "       (SELECT count(*) FROM webhooks.alert_delivery_queue q"
            "        JOIN webhooks.messages m ON m.message_id = q.message_id"
            "        WHERE q.delivery_id NOT BETWEEN m.first_delivery_id AND m.last_delivery_id"
            "           OR m.tenant_id <> q.tenant_id)")
        assert (orphans, without, outside) == (0, 0, 0), (
            f"messages without a delivery: {orphans}, deliveries without their message: {without},"
            f" deliveries outside their message's range or tenant: {outside}")

    @invariant()
    def every_row_is_one_a_step_made(self) -> None:
        rows = self.sql("SELECT q.delivery_id, t.name FROM webhooks.alert_delivery_queue q"
                        " JOIN webhooks.tenants t ON t.id = q.tenant_id")
        unknown = [(i, t) for i, t in rows if self.made.get(i) != t]
        assert not unknown, f"rows no step made, or in another tenant: {unknown}"

    @invariant()
    def endpoints_are_as_the_model_says(self) -> None:
        stored = self.sql("SELECT e.id, t.name, e.name, e.active FROM webhooks.endpoints e"
                          " JOIN webhooks.tenants t ON t.id = e.tenant_id ORDER BY 1")
        assert stored == [(e.id, e.tenant, e.name, e.active) for e in sorted(self.live(), key=lambda e: e.id)]

    @invariant()
    def each_tenant_sees_its_own_and_nothing_of_the_other(self) -> None:
        for tenant in self.tenants.values():
            ever = {e.id for e in self.endpoints.values() if e.tenant == tenant.name}
            query = "SELECT delivery_id FROM webhooks.alert_delivery_queue WHERE tenant_id = %s"
            before = {r[0] for r in self.sql(query, (tenant.id,))}
            deliveries = self.listed("/v1/deliveries?limit=1000", tenant.reader)
            after = {r[0] for r in self.sql(query, (tenant.id,))}
            listed = {d["delivery_id"] for d in deliveries}
            assert {d["endpoint_id"] for d in deliveries} <= ever, (tenant.name, deliveries)
            assert all(self.made.get(i) == tenant.name for i in listed), (tenant.name, listed)
            assert before & after <= listed, f"{tenant.name}'s rows not listed: {(before & after) - listed}"
            dead = self.listed("/v1/dead-letters?limit=1000", tenant.reader)
            assert {d["endpoint_id"] for d in dead} <= ever and all(
                self.made.get(d["delivery_id"]) == tenant.name for d in dead), (tenant.name, dead)
            messages = self.listed("/v1/messages?limit=1000", tenant.reader)
            assert {d["endpoint_id"] for m in messages for d in m["deliveries"]} <= ever, (
                tenant.name, messages)
            endpoints = self.listed("/v1/endpoints?limit=1000", tenant.reader)
            assert sorted(e["id"] for e in endpoints) == sorted(e.id for e in self.live(tenant.name))

    def listed(self, path: str, token: str) -> list[dict[str, Any]]:
        answer = self.http.get(path, token)
        assert answer.status == 200, (path, answer.body)
        items: list[dict[str, Any]] = answer.json["items"]
        return items

    # --- the end of an example -----------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if self.tenants:
                self.drain()
                self.messages_and_deliveries_point_at_each_other()
        finally:
            for worker in self.workers:
                worker.kill()
            self.api.kill()
            for conn in (self.owner, self.producer_sql, self.worker_sql):
                conn.close()
            with psycopg.connect(self.fx.pg_server, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {conninfo_to_dict(self.dsn)['dbname']} WITH (FORCE)")


@pytest.fixture
def fixtures(template_db: str, fresh_db: Callable[[bool], str], pg_server: str, receiver: Receiver,
             tmp_path: Path) -> Iterator[Fixtures]:
    made = Fixtures(fresh_db, pg_server, receiver, tmp_path)
    yield made
    for worker in made.spawned:
        worker.kill()
    unexpected = {w.name: w.unexpected_errors() for w in made.spawned}
    assert not {name: lines for name, lines in unexpected.items() if lines}, unexpected


def test_the_rules_hold_together_whatever_the_order_of_calls(fixtures: Fixtures) -> None:
    run_state_machine_as_test(
        lambda: RulesTogether(fixtures),
        settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
            # the suite runs a fixed sequence of examples; by hand, random ones
            # (never shrunk: each example starts processes, and a failure prints every step it took)
            derandomize=not BY_HAND, print_blob=BY_HAND, phases=(Phase.explicit, Phase.generate),
            suppress_health_check=list(HealthCheck)),
    )
