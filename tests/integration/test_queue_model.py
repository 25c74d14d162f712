"""The queue's SQL API against a small Python model of it: Hypothesis drives enqueue, acquire, finish
(delivered, retry, deferred, dead letter, stale), release, lease expiry and replay in any order, and
after every step the rows, their leases and the audit log must be what the model says."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.support import add_endpoint, worker_dsn

MAX_ATTEMPTS = 3
MAX_DEFERRALS = 1
LEASE_SECONDS = 300
WORKER = "model-worker"
FINAL = ("delivered", "dead_letter")
# A retry that does not count against the circuit (a redirect), and a deferral that does not either
# (429 with Retry-After): the model is about the queue, not about the circuit breaker.
OUTCOMES = {
    "delivered": {"outcome": "delivered", "http_status": 200},
    "retry": {"outcome": "retry", "http_status": 302, "failure_category": "redirect", "error": "HTTP 302"},
    "deferred": {"outcome": "deferred", "http_status": 429, "failure_category": "rate_limited",
                 "error": "HTTP 429"},
    "dead_letter": {"outcome": "dead_letter", "http_status": 400, "failure_category": "http_4xx",
                    "error": "HTTP 400", "reason": "HTTP 400"},
}


@dataclass
class Row:
    """What the model expects of one queued delivery."""

    key: str
    status: str = "pending"
    attempts: int = 0
    deferrals: int = 0
    replays: int = 0
    failure_category: str | None = None
    lease: str | None = None
    # The order claims take due rows in: the logical time the row last became due, then its id.
    due_at: int = 0
    log_rows: int = 0
    old_leases: list[str] = field(default_factory=list)
    # leases this worker finished, with the status it wrote: the same outcome sent again (its
    # answer lost) is answered as applied with that status, and not logged again
    finished_leases: dict[str, str] = field(default_factory=dict)


class QueueModel(RuleBasedStateMachine):
    def __init__(self, owner_dsn: str, worker_login_dsn: str) -> None:
        super().__init__()
        self.owner = psycopg.connect(owner_dsn, autocommit=True)
        self.worker = psycopg.connect(worker_login_dsn, autocommit=True)
        self.rows: dict[int, Row] = {}
        self.clock = 0
        # Each example has an endpoint of its own; the previous one was switched off in teardown.
        self.endpoint = add_endpoint(
            owner_dsn, "https://hooks.example.test/model", max_attempts=MAX_ATTEMPTS, max_in_flight=1000,
            circuit_policy={"min_attempts": 1_000_000})

    def in_flight(self) -> list[int]:
        return sorted(i for i, r in self.rows.items() if r.status == "delivering")

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    # --- producers ---------------------------------------------------------------------------

    @initialize()
    def start_with_one_row(self) -> None:
        self.enqueue(None)

    @rule(key=st.none() | st.sampled_from(["k1", "k2", "k3"]))
    def enqueue(self, key: str | None) -> None:
        [(delivery_id,)] = self.owner.execute(
            "SELECT webhooks.enqueue(%s, 'alert.created', '{}'::jsonb, %s)", (self.endpoint, key)).fetchall()
        same_key = [i for i, r in self.rows.items() if key is not None and r.key == key]
        if same_key:
            assert [delivery_id] == same_key, "a repeated key returns the row it already made"
            return
        assert delivery_id not in self.rows
        if key is None:
            # no key given: the event id is the key, new for every call
            [(key,)] = self.owner.execute("SELECT event_id FROM webhooks.alert_delivery_queue"
                                          " WHERE delivery_id = %s", (delivery_id,)).fetchall()
            assert key not in {r.key for r in self.rows.values()}
        self.rows[delivery_id] = Row(key=key, due_at=self.tick())

    # --- the worker's calls --------------------------------------------------------------------

    @rule(batch=st.integers(1, 6))
    def acquire(self, batch: int) -> None:
        claimed = self.worker.execute(
            "SELECT delivery_id, attempt, lease_token::text FROM webhooks.acquire(%s, %s, %s)",
            (WORKER, batch, LEASE_SECONDS)).fetchall()
        due = sorted((r.due_at, i) for i, r in self.rows.items() if r.status in ("pending", "retrying"))
        expected = [i for _, i in due[:batch]]
        assert sorted(c[0] for c in claimed) == sorted(expected), "the due rows, oldest first"
        for delivery_id, attempt, lease in claimed:
            row = self.rows[delivery_id]
            row.status, row.attempts, row.lease = "delivering", row.attempts + 1, lease
            assert attempt == row.attempts

    @precondition(lambda self: self.in_flight())
    @rule(data=st.data(), kind=st.sampled_from(sorted(OUTCOMES)))
    def finish(self, data: st.DataObject, kind: str) -> None:
        leased = self.in_flight()
        chosen = data.draw(st.lists(st.sampled_from(leased), min_size=1, max_size=4, unique=True))
        outcomes = [{"delivery_id": i, "lease_token": self.rows[i].lease, "attempt": self.rows[i].attempts,
                     "retry_after_s": 0, "latency_ms": 5, **OUTCOMES[kind]} for i in chosen]
        results = self._finish(outcomes)
        now = self.tick()
        for delivery_id in chosen:
            row = self.rows[delivery_id]
            lease = row.lease
            status = self._decide(row, kind, now)
            assert results[delivery_id] == (True, status)
            row.finished_leases[lease] = status

    @precondition(lambda self: any(r.old_leases for r in self.rows.values()))
    @rule(data=st.data())
    def stale_finish(self, data: st.DataObject) -> None:
        """An outcome whose lease was taken over, released or expired: logged as stale, row untouched.
        Under a lease this worker already finished it is that finish sent again: answered as then."""
        stale = sorted(i for i, r in self.rows.items() if r.old_leases)
        delivery_id = data.draw(st.sampled_from(stale))
        row = self.rows[delivery_id]
        lease = data.draw(st.sampled_from(row.old_leases))
        results = self._finish([{"delivery_id": delivery_id, "lease_token": lease, "attempt": 1,
                                 "retry_after_s": 0, **OUTCOMES["delivered"]}])
        if lease in row.finished_leases:
            assert results[delivery_id] == (True, row.finished_leases[lease])
            return
        assert results[delivery_id] == (False, "stale")
        row.log_rows += 1

    @precondition(lambda self: self.in_flight())
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        leased = self.in_flight()
        chosen = data.draw(st.lists(st.sampled_from(leased), min_size=1, max_size=4, unique=True))
        leases = [{"delivery_id": i, "lease_token": self.rows[i].lease} for i in chosen]
        [(released,)] = self.worker.execute("SELECT webhooks.release(%s, %s)",
                                            (WORKER, json.dumps(leases))).fetchall()
        assert released == len(chosen)
        for delivery_id in chosen:
            row = self.rows[delivery_id]
            first_try = row.attempts <= 1 and row.failure_category is None
            row.status = "pending" if first_try else "retrying"
            row.attempts -= 1
            row.log_rows += 1  # it keeps its due time: its place ahead of what waited behind it
            self._end_lease(row)

    @precondition(lambda self: self.in_flight())
    @rule(data=st.data())
    def leases_expire(self, data: st.DataObject) -> None:
        """The clock passes the lease of some rows in flight (moved in the database, not waited for)."""
        leased = self.in_flight()
        chosen = data.draw(st.lists(st.sampled_from(leased), min_size=1, max_size=4, unique=True))
        self.owner.execute("UPDATE webhooks.alert_delivery_queue SET locked_until = now() - interval '1 s'"
                           " WHERE delivery_id = ANY(%s)", (chosen,))
        [(reaped,)] = self.owner.execute("SELECT webhooks.reap_expired_leases()").fetchall()
        assert reaped == len(chosen)
        for delivery_id in chosen:
            row = self.rows[delivery_id]
            row.status = "dead_letter" if row.attempts >= MAX_ATTEMPTS else "retrying"
            row.failure_category = "internal"
            row.log_rows += 1  # it keeps its due time, as a released row does
            self._end_lease(row)

    @precondition(lambda self: any(r.status in FINAL for r in self.rows.values()))
    @rule(data=st.data())
    def replay(self, data: st.DataObject) -> None:
        final = sorted(i for i, r in self.rows.items() if r.status in FINAL)
        delivery_id = data.draw(st.sampled_from(final))
        [(replayed,)] = self.owner.execute("SELECT webhooks.replay(%s)", (delivery_id,)).fetchall()
        assert replayed is True
        row = self.rows[delivery_id]
        row.status, row.attempts, row.deferrals = "pending", 0, 0
        row.replays += 1
        row.due_at = self.tick()
        row.log_rows += 1

    # --- what must hold after every step -----------------------------------------------------

    @invariant()
    def rows_match_the_model(self) -> None:
        stored = {r[0]: r[1:] for r in self.owner.execute(
            "SELECT delivery_id, idempotency_key, status, attempts, deferrals, replays, failure_category,"
            "       lease_token::text, locked_by, locked_until IS NOT NULL"
            " FROM webhooks.alert_delivery_queue WHERE webhook_id = %s", (self.endpoint,))}
        assert set(stored) == set(self.rows)
        for delivery_id, (key, status, attempts, deferrals, replays, category, lease, locked_by,
                          has_lease_end) in stored.items():
            row = self.rows[delivery_id]
            assert (key, status, attempts, deferrals, replays, category) == (
                row.key, row.status, row.attempts, row.deferrals, row.replays, row.failure_category)
            assert 0 <= attempts <= MAX_ATTEMPTS
            # past the cap a deferral counts as an attempt, so no receiver can defer forever
            assert deferrals <= MAX_DEFERRALS + attempts
            # a lease exactly while in flight, and it is the one the claim returned
            if status == "delivering":
                assert (lease, locked_by, has_lease_end) == (row.lease, WORKER, True)
            else:
                assert (lease, locked_by, has_lease_end) == (None, None, False)

    @invariant()
    def the_audit_log_has_a_row_per_attempt_and_change(self) -> None:
        logged = dict(self.owner.execute(
            "SELECT delivery_id, count(*) FROM webhooks.alert_delivery_log WHERE webhook_id = %s"
            " GROUP BY delivery_id", (self.endpoint,)).fetchall())
        assert {i: logged.get(i, 0) for i in self.rows} == {i: r.log_rows for i, r in self.rows.items()}

    def teardown(self) -> None:
        """The clock runs out: every attempt fails until each row is delivered or dead-lettered; rows
        with an even id fail with an outcome, rows with an odd id by losing their lease."""
        try:
            for _ in range(MAX_ATTEMPTS + 2):
                if all(r.status in FINAL for r in self.rows.values()):
                    break
                self.leases_expire_all()
                self.acquire(len(self.rows))
                leased = self.in_flight()
                failing = [i for i in leased if i % 2 == 0]
                if failing:
                    outcomes = [{"delivery_id": i, "lease_token": self.rows[i].lease,
                                 "attempt": self.rows[i].attempts, "retry_after_s": 0, **OUTCOMES["retry"]}
                                for i in failing]
                    results = self._finish(outcomes)
                    now = self.tick()
                    for i in failing:
                        assert results[i] == (True, self._decide(self.rows[i], "retry", now))
                self.leases_expire_all()
                self.rows_match_the_model()
            assert all(r.status in FINAL for r in self.rows.values()), "every row ends delivered or dead"
            self.the_audit_log_has_a_row_per_attempt_and_change()
        finally:
            self.owner.execute("UPDATE webhooks.endpoints SET active = false WHERE id = %s", (self.endpoint,))
            self.owner.close()
            self.worker.close()

    # --- the model's own bookkeeping -----------------------------------------------------------

    def leases_expire_all(self) -> None:
        leased = self.in_flight()
        if leased:
            self.leases_expire(_Fixed(leased))

    def _finish(self, outcomes: list[dict[str, Any]]) -> dict[int, tuple[bool, str]]:
        rows = self.worker.execute("SELECT delivery_id, applied, status FROM webhooks.finish(%s, %s)",
                                   (WORKER, json.dumps(outcomes))).fetchall()
        assert len(rows) == len(outcomes)
        return {r[0]: (r[1], r[2]) for r in rows}

    def _decide(self, row: Row, kind: str, now: int) -> str:
        """finish()'s decision for one applied outcome, applied to the model; returns the new status."""
        spec = OUTCOMES[kind]
        row.log_rows += 1
        row.failure_category = spec.get("failure_category")
        self._end_lease(row)
        if kind == "deferred":
            row.deferrals += 1
            if row.deferrals <= MAX_DEFERRALS:
                # the receiver asked for time: the attempt is given back
                row.attempts -= 1
                row.status, row.due_at = "retrying", now
                return row.status
        if kind in ("delivered", "dead_letter"):
            row.status = kind
        elif row.attempts >= MAX_ATTEMPTS:
            row.status = "dead_letter"
        else:
            row.status, row.due_at = "retrying", now
        return row.status

    @staticmethod
    def _end_lease(row: Row) -> None:
        if row.lease is not None:
            row.old_leases.append(row.lease)
        row.lease = None


class _Fixed:
    """A stand-in for st.data() that always draws the given rows (used by teardown)."""

    def __init__(self, rows: list[int]) -> None:
        self.rows = rows

    def draw(self, _strategy: Any) -> list[int]:
        return self.rows


def test_the_queue_behaves_as_its_model_in_any_order_of_calls(db):
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE webhooks.delivery_config SET max_deferrals = %s", (MAX_DEFERRALS,))
    worker_login = worker_dsn(db)
    run_state_machine_as_test(
        lambda: QueueModel(db, worker_login),
        settings=settings(max_examples=100, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                 HealthCheck.too_slow]),
    )


