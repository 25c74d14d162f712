"""The API's listeners: slow clients cut off by the head and body deadlines while others are served,
connections capped per address and in total, and /metrics only on its own port."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.api.server import ApiProcess, ApiServer, api_config, make_token
from tests.support import ROOT, eventually
from worker.api.serving import counted_as

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
        assert 'webhook_api_connections_refused_total{cap="per_address",port="api"} 1.0' in metrics
        assert 'webhook_api_connections_refused_total{cap="total",port="api"} 1.0' in metrics
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
    # More slow connections than the process may open files. Unguarded, accept()
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
        counted = f'webhook_api_connections_refused_total{{cap="per_address",port="api"}} {FLOOD - 30}.0'
        assert counted in metrics
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


class KeptAlive:
    """A keep-alive HTTP/1.1 client from a source address of its own that has had one answer and
    keeps its connection open, idle."""

    def __init__(self, port: int, source: str, path: str = "/health") -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30, source_address=(source, 0))
        self.conn.request("GET", path)
        response = self.conn.getresponse()
        assert response.status == 200 and response.read()
        assert self.conn.sock is not None  # kept open for the next request
        self.sock: socket.socket = self.conn.sock

    def closed_by_server(self) -> bool:
        """Whether the server has closed the connection (an EOF waits to be read); never blocks."""
        self.sock.setblocking(False)
        try:
            return self.sock.recv(1) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True
        finally:
            self.sock.setblocking(True)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def kept_alive() -> Iterator[list[KeptAlive]]:
    opened: list[KeptAlive] = []
    yield opened
    for client in opened:
        client.close()


def test_idle_keep_alive_connections_make_room_for_new_clients_at_the_caps(db, clients, kept_alive):
    # Two addresses hold six idle keep-alive connections each: the total cap (12) is reached, as ten
    # addresses holding ten each once kept every other client and the scrape out for 75 s.
    # aiohttp's own keep-alive timer far beyond the test's length: here only the caps close them
    config = api_config(db, max_connections=12, max_connections_per_address=6, head_timeout_seconds=60,
                        keepalive_timeout_seconds=1800)
    server = ApiServer(config).start()
    guard = server.guard
    assert guard is not None
    try:
        reader = make_token(db, "reader")
        for source in ("127.0.0.2", "127.0.0.3"):
            kept_alive.extend(KeptAlive(server.port, source) for _ in range(6))
        eventually(lambda: len(guard.idle) == 12 and guard.open == 12, message="twelve idle connections")

        # a third address is served: the longest-idle connection (127.0.0.2's first) made room
        assert get(server.port, "/v1/token", reader, source="127.0.0.4") == 200
        eventually(kept_alive[0].closed_by_server, message="the longest-idle connection closed")
        assert not any(client.closed_by_server() for client in kept_alive[1:])
        # the scrape is served, whatever the public port holds
        assert get(server.metrics_port, "/metrics", source="127.0.0.5") == 200

        # at its own cap (6), an address's new connection closes that address's longest-idle one, not
        # another address's
        eventually(lambda: guard.by_address["127.0.0.2"] == 5, message="127.0.0.2 down to five")
        kept_alive.append(KeptAlive(server.port, "127.0.0.2"))
        kept_alive.append(KeptAlive(server.port, "127.0.0.2"))
        eventually(kept_alive[1].closed_by_server, message="127.0.0.2's longest-idle connection closed")
        assert not any(client.closed_by_server() for client in kept_alive[2:6] + kept_alive[6:12])

        # a connection whose next request has begun is not idle: at a cap of busy ones, 503
        for client in kept_alive[6:12]:  # 127.0.0.3's: requests begun that never end
            client.sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        eventually(lambda: not any(c.address == "127.0.0.3" for c in guard.idle),
                   message="127.0.0.3's connections busy")
        over = RawClient(server.port, source="127.0.0.3")
        clients.append(over)
        assert over.read_until_closed().startswith(b"HTTP/1.1 503 ")
        assert not any(client.closed_by_server() for client in kept_alive[6:12])

        closed = [line for line in server.metrics().splitlines()
                  if line.startswith("webhook_api_idle_connections_closed_total")]
        assert closed == ['webhook_api_idle_connections_closed_total{port="api"} 2.0',
                          'webhook_api_idle_connections_closed_total{port="metrics"} 0.0'], closed
    finally:
        server.stop()


def test_the_metrics_port_has_a_budget_of_its_own(db, clients):
    # the public port full of connections that are not idle (heads that never end) ...
    config = api_config(db, max_connections=4, max_connections_per_address=4, head_timeout_seconds=60,
                        metrics_max_connections=8)
    server = ApiServer(config).start()
    guard = server.guard
    assert guard is not None
    try:
        for _ in range(4):
            client = RawClient(server.port)
            clients.append(client)
            client.send(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        eventually(lambda: guard.open == 4, message="the public port full")
        refused = RawClient(server.port, source="127.0.0.2")
        clients.append(refused)
        assert refused.read_until_closed().startswith(b"HTTP/1.1 503 ")
        # ... the scrape is still served
        assert get(server.metrics_port, "/metrics") == 200

        # the metrics port's own budget: a quarter of it (2) per address, then 503 for that address only
        for _ in range(2):
            client = RawClient(server.metrics_port, source="127.0.0.3")
            clients.append(client)
            client.send(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        over = RawClient(server.metrics_port, source="127.0.0.3")
        clients.append(over)
        assert over.read_until_closed().startswith(b"HTTP/1.1 503 ")
        status, metrics = fetch(server.metrics_port, "/metrics", source="127.0.0.4")
        assert status == 200
        assert 'webhook_api_connections_refused_total{cap="per_address",port="metrics"} 1.0' in metrics
        assert 'webhook_api_connections_refused_total{cap="total",port="api"} 1.0' in metrics
        assert 'webhook_api_connections{port="api"} 4.0' in metrics
    finally:
        server.stop()


def test_ipv6_clients_count_per_64():
    assert counted_as("2001:db8:1:2:aaaa::1") == counted_as("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert counted_as("2001:db8:1:3::1") == "2001:db8:1:3::/64"
    assert counted_as("fe80::1%eth0") == "fe80::/64"
    assert counted_as("::ffff:192.0.2.7") == "192.0.2.7"  # an IPv4-mapped address counts as the IPv4 one
    assert counted_as("192.0.2.7") == "192.0.2.7"
    assert counted_as("::1") == "::/64"


def ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback(), reason="this kernel has no IPv6 loopback (::1)")
def test_ipv6_connections_are_capped_per_64_on_a_real_listener(db):
    config = api_config(db, host="::1", max_connections_per_address=2, head_timeout_seconds=60)
    server = ApiServer(config).start()
    guard = server.guard
    assert guard is not None
    held = []
    try:
        for _ in range(2):
            sock = socket.create_connection(("::1", server.port), timeout=10)
            held.append(sock)
        eventually(lambda: dict(guard.by_address) == {"::/64": 2}, message="two connections from ::/64")
        with socket.create_connection(("::1", server.port), timeout=10) as over:
            answer = b""
            while chunk := over.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 503 "), answer
    finally:
        for sock in held:
            sock.close()
        server.stop()


def raw_answer(port: int, request: bytes) -> bytes:
    """What the server answers to these bytes, read until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    return answer


def problem_of(answer: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), headers, json.loads(body)


def test_a_request_too_long_to_read_is_answered_with_a_problem_document_that_does_not_echo_it(api):
    cases = [
        # a request target over 8,190 bytes: 414
        (b"GET /v1/deliveries?event_type=" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
         "/v1/problems/uri-too-long"),
        # a header over 16 KiB: 431
        (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 17000 + b"\r\n\r\n", 431,
         "/v1/problems/header-too-large"),
        # more than 128 headers: 431
        (b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: c\r\n" % i for i in range(200)) + b"\r\n",
         431, "/v1/problems/header-too-large"),
        # not HTTP at all: 400
        (b"GET\x01 /dddd HTTP/1.1\r\n\r\n", 400, "/v1/problems/unreadable-request"),
    ]
    for request, status, kind in cases:
        answer = raw_answer(api.port, request)
        got, headers, problem = problem_of(answer)
        assert (got, problem["type"], problem["status"]) == (status, kind, status), answer[:300]
        assert headers["content-type"] == "application/problem+json"
        assert headers["cache-control"] == "no-store" and headers["x-content-type-options"] == "nosniff"
        for echoed in (b"aaaa", b"bbbb", b"X-1", b"dddd"):
            assert echoed not in answer, answer[:300]
    # a request target of 8,000 bytes is still read
    assert raw_answer(api.port, b"GET /health?" + b"e" * 8000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close"
                      b"\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    metrics = api.metrics()
    for status in (400, 414):
        assert f'webhook_api_unreadable_requests_total{{status="{status}"}} 1.0' in metrics
    assert 'webhook_api_unreadable_requests_total{status="431"} 2.0' in metrics
