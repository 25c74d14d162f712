"""The API's listeners: slow clients cut off by the head and body deadlines while others are served,
connections capped per address and in total, and /metrics only on its own port."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.api.server import ApiProcess, ApiServer, api_config, make_token
from tests.support import ROOT, eventually

SLOW_CLIENTS = 30  # of each kind
DEADLINE = 1.5  # seconds, for heads and bodies alike
# Each round sends every slow client one more byte; at most 30 s of rounds, so at most 120 bytes each.
ROUND_SECONDS = 0.25
ROUNDS_TIMEOUT = 30.0


class RawClient:
    """A client on a raw socket that sends what it is told, as slowly as it is told."""

    def __init__(self, port: int, source: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        self.received = b""
        self.closed = False

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self.sock.sendall(data)
        except OSError:  # reset or broken pipe: the server closed it
            self.closed = True

    def poll(self) -> bool:
        """Read what has arrived without waiting; True once the server has closed the connection."""
        if self.closed:
            return True
        self.sock.setblocking(False)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    self.closed = True
                    break
                self.received += chunk
        except BlockingIOError:
            pass
        except OSError:
            self.closed = True
        finally:
            self.sock.setblocking(True)
        return self.closed

    def read_until_closed(self) -> bytes:
        """Everything the server sends until it closes; fails (socket timeout) if it never does."""
        self.sock.settimeout(10)
        while chunk := self.sock.recv(65536):
            self.received += chunk
        self.closed = True
        return self.received

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def clients() -> Iterator[list[RawClient]]:
    opened: list[RawClient] = []
    yield opened
    for client in opened:
        client.close()


def fetch(port: int, path: str, token: str | None = None, source: str = "127.0.0.1") -> tuple[int, str]:
    """GET from a source address of its own (every 127.0.0.0/8 address is this machine)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def get(port: int, path: str, token: str | None = None, source: str = "127.0.0.1") -> int:
    return fetch(port, path, token, source)[0]


def test_slow_heads_and_bodies_are_cut_off_by_their_deadlines_while_valid_requests_answer(db, clients):
    config = api_config(db, head_timeout_seconds=DEADLINE, body_timeout_seconds=DEADLINE)
    server = ApiServer(config).start()
    try:
        producer = make_token(db, "producer")
        # a keep-alive client that has finished its request: idle, not slow, so no deadline applies
        idle = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        idle.request("GET", "/v1/token", headers={"Authorization": f"Bearer {producer}"})
        assert idle.getresponse().read() and idle.sock is not None
        heads, bodies = [], []
        for _ in range(SLOW_CLIENTS):
            client = RawClient(server.port)
            clients.append(client)
            client.send(b"GET /v1/token HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # a head that never ends
            heads.append(client)
        for _ in range(SLOW_CLIENTS):
            client = RawClient(server.port)
            clients.append(client)
            client.send(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Authorization: Bearer " + producer.encode() + b"\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
            bodies.append(client)

        # while they trickle, valid requests from other connections are answered
        assert server.get("/v1/token", producer).status == 200
        published = server.post("/v1/messages", producer, {"event_type": "order.paid", "payload": {"n": 1}})
        assert published.status == 202, published.body

        def trickle() -> bool:
            for client in heads:
                client.send(b"a")
            for client in bodies:
                client.send(b" ")
            return all([client.poll() for client in heads + bodies])

        eventually(trickle, timeout=ROUNDS_TIMEOUT, interval=ROUND_SECONDS,
                   message="every slow client closed by the deadline")
        for client in heads:
            # nothing had been answered on these connections, so each is told why before the close
            assert client.received.startswith(b"HTTP/1.1 408 "), client.received[:200]
        for client in bodies:
            assert client.received.startswith(b"HTTP/1.1 408 "), client.received[:200]
            assert b"application/problem+json" in client.received
            assert b"the request body did not arrive within 1.5 s" in client.received
        # the idle keep-alive connection outlived the deadline that closed the slow heads
        socket_before = idle.sock
        idle.request("GET", "/v1/token", headers={"Authorization": f"Bearer {producer}"})
        assert idle.getresponse().status == 200 and idle.sock is socket_before
        idle.close()
        counted = [line for line in server.metrics().splitlines()
                   if line.startswith("webhook_api_request_timeouts_total")]
        assert counted == [f'webhook_api_request_timeouts_total{{part="head"}} {SLOW_CLIENTS}.0',
                           f'webhook_api_request_timeouts_total{{part="body"}} {SLOW_CLIENTS}.0'], counted
    finally:
        server.stop()


def test_connections_beyond_a_cap_are_refused_at_once_and_other_addresses_are_served(db, clients):
    # deadlines long enough that the connections held open here stay open
    config = api_config(db, max_connections_per_address=5, max_connections=8, head_timeout_seconds=60)
    server = ApiServer(config).start()
    guard = server.guard
    assert guard is not None
    try:
        reader = make_token(db, "reader")
        first = [RawClient(server.port) for _ in range(5)]
        clients.extend(first)
        eventually(lambda: guard.by_address["127.0.0.1"] == 5, message="five connections from 127.0.0.1")
        over = RawClient(server.port)
        clients.append(over)
        # answered 503 and closed before a byte of a request was read
        answer = over.read_until_closed()
        assert answer.startswith(b"HTTP/1.1 503 ") and b"Connection: close" in answer, answer
        # another address is still served
        assert get(server.port, "/v1/token", reader, source="127.0.0.2") == 200
        eventually(lambda: guard.open == 5, message="the request's connection closed")

        # the total cap: 5 + 3 = 8 connections open, so a third address is refused too
        second = [RawClient(server.port, source="127.0.0.2") for _ in range(3)]
        clients.extend(second)
        eventually(lambda: guard.open == 8, message="eight connections open")
        third = RawClient(server.port, source="127.0.0.3")
        clients.append(third)
        assert third.read_until_closed().startswith(b"HTTP/1.1 503 ")
        # a closed connection frees its place at once
        first[0].close()
        eventually(lambda: guard.open == 7, message="a place freed")
        assert get(server.port, "/v1/token", reader, source="127.0.0.3") == 200

        for client in first[1:] + second:
            client.close()
        eventually(lambda: guard.open == 0, message="every connection released")
        metrics = server.metrics()
        assert 'webhook_api_connections_refused_total{cap="per_address"} 1.0' in metrics
        assert 'webhook_api_connections_refused_total{cap="total"} 1.0' in metrics
    finally:
        server.stop()


def test_metrics_are_served_on_their_own_port_and_not_on_the_public_one(api, role_tokens):
    assert api.get("/v1/token", role_tokens["reader"]).status == 200
    # the public port: request counts per route and status would let any caller watch the traffic
    assert api.get("/metrics").status == 404
    assert api.metrics_port != api.port
    metrics = api.metrics()
    assert 'webhook_api_requests_total{method="GET",route="/v1/token",status="200"} 1.0' in metrics
    # the metrics port serves nothing else
    assert get(api.metrics_port, "/v1/token", role_tokens["reader"]) == 404
    assert get(api.metrics_port, "/health") == 404


def test_the_connection_cap_is_lowered_to_what_the_open_file_limit_leaves():
    # a cap above the open-file limit is no cap: accept() fails first, and valid clients time out
    program = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (100, 200))\n"
        "from worker.api.serving import fit_to_open_files\n"
        "print(fit_to_open_files(1000, 68), fit_to_open_files(100, 68),"
        " resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT,
                            timeout=60, check=True)
    # the soft limit raised to the hard one (200), then 200 - 68 connections fit; 100 fit as asked
    *log, answer = result.stdout.splitlines()
    assert answer.split() == ["132", "100", "200"]
    assert "api.max_connections lowered" in "\n".join(log)


FLOOD = 300


def test_a_flood_of_connections_beyond_the_open_file_limit_leaves_other_addresses_served(
        db, tmp_path, clients):
    # The case: more slow connections than the process may open files. Unguarded, accept()
    # failed ("out of system resource"), stopped accepting, and a valid request timed out.
    process = ApiProcess(db, tmp_path, open_files=256, max_connections_per_address=30,
                         head_timeout_seconds=60)
    try:
        reader = make_token(db, "reader")
        for _ in range(FLOOD):
            client = RawClient(process.port)
            clients.append(client)
            client.send(b"GET /v1/token HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        assert get(process.port, "/v1/token", reader, source="127.0.0.2") == 200
        refused = eventually(lambda: sum(c.poll() for c in clients) == FLOOD - 30 and
                             [c for c in clients if c.closed], message="all but 30 refused")
        assert all(c.received.startswith(b"HTTP/1.1 503 ") for c in refused)
        status, metrics = fetch(process.metrics_port, "/metrics", source="127.0.0.2")
        assert status == 200
        assert f'webhook_api_connections_refused_total{{cap="per_address"}} {FLOOD - 30}.0' in metrics
    finally:
        process.kill()
    log = process.log_path.read_text()
    assert "out of system resource" not in log
    # 256 files, less those reserved, less the listening backlogs
    assert '"api.max_connections lowered to what the open-file limit leaves"' in log


def test_a_port_already_taken_is_a_config_error_naming_the_key(db, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "api.yaml"
        config.write_text(f"database:\n  url: {db}\napi:\n  host: 127.0.0.1\n  port: 0\n"
                          f"  metrics_port: {port}\n")
        result = subprocess.run([sys.executable, "-m", "worker", "api", "--config", str(config)],
                                capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"api.metrics_port: cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr


def test_the_rest_of_a_body_that_missed_its_deadline_is_not_counted_as_a_slow_head(db, clients):
    # aiohttp reads and drops an abandoned body's rest for a while (its linger, here the body
    # deadline's 3 s) before it closes: bytes still trickling then are not a new request's head,
    # so the head deadline (0.5 s here, shorter than the linger) must not start on them
    config = api_config(db, head_timeout_seconds=0.5, body_timeout_seconds=3.0)
    server = ApiServer(config).start()
    try:
        producer = make_token(db, "producer")
        client = RawClient(server.port)
        clients.append(client)
        client.send(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Authorization: Bearer " + producer.encode() + b"\r\n"
                    b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")

        def trickle() -> bool:
            client.send(b" ")
            return client.poll()

        eventually(trickle, timeout=30.0, interval=0.1, message="the slow body's connection closed")
        assert client.received.startswith(b"HTTP/1.1 408 "), client.received[:200]
        counted = [line for line in server.metrics().splitlines()
                   if line.startswith("webhook_api_request_timeouts_total")]
        assert counted == ['webhook_api_request_timeouts_total{part="head"} 0.0',
                           'webhook_api_request_timeouts_total{part="body"} 1.0'], counted
    finally:
        server.stop()
