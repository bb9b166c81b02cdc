"""The one outbound client refuses private addresses before any packet leaves (STYLE §12)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import pytest

from alerts import outbound
from tests.test_alerts_support import loopback, receiver
from tests.webhook_receiver import WebhookReceiver

__all__ = ["loopback", "receiver"]


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every address the client opens a socket to (the real connect still happens)."""
    opened: list[tuple[str, int]] = []
    real = socket.create_connection

    def record(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        opened.append(address)
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", record)
    return opened


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://127.1/hook",
        "http://2130706433/hook",  # 127.0.0.1 as one number
        "http://[::1]/hook",
        "http://10.0.0.5/hook",
        "http://172.16.3.4/hook",
        "http://192.168.1.1/hook",
        "http://169.254.169.254/latest/meta-data/",  # cloud metadata
        "http://[fe80::1]/hook",
        "http://[::ffff:10.0.0.1]/hook",  # IPv4-mapped IPv6
        "http://[2002:a00:1::]/hook",  # 6to4 of 10.0.0.1
        "http://[64:ff9b::a9fe:a9fe]/hook",  # NAT64 of 169.254.169.254
        "http://0.0.0.0/hook",
        "http://224.0.0.1/hook",
        "http://100.64.0.1/hook",  # carrier-grade NAT
        "http://[fec0::1]/hook",  # IPv6 site-local: deprecated, still routed inside sites
        "http://localhost/hook",
    ],
)
def test_private_loopback_link_local_and_multicast_addresses_are_refused(
    url: str, connections: list[tuple[str, int]]
) -> None:
    with pytest.raises(outbound.Refused, match="not allowed"):
        outbound.post(url, b"{}", {})
    assert connections == []


def test_a_dns_name_resolving_to_a_private_address_is_refused(
    monkeypatch: pytest.MonkeyPatch, connections: list[tuple[str, int]]
) -> None:
    monkeypatch.setattr(outbound, "resolve", lambda host, port: ["10.1.2.3"])
    with pytest.raises(outbound.Refused, match="hooks.example.com resolves to 10.1.2.3"):
        outbound.post("https://hooks.example.com/x", b"{}", {})
    assert connections == []


def test_a_name_with_one_private_address_among_public_ones_is_refused(
    monkeypatch: pytest.MonkeyPatch, connections: list[tuple[str, int]]
) -> None:
    monkeypatch.setattr(outbound, "resolve", lambda host, port: ["93.184.215.14", "192.168.0.9"])
    with pytest.raises(outbound.Refused, match="192.168.0.9"):
        outbound.post("https://mixed.example.com/x", b"{}", {})
    assert connections == []


@pytest.mark.parametrize("url", ["ftp://example.com/x", "file:///etc/passwd", "gopher://x/"])
def test_only_http_and_https_are_allowed(url: str, connections: list[tuple[str, int]]) -> None:
    with pytest.raises(outbound.Refused, match="only http and https"):
        outbound.post(url, b"{}", {})
    assert connections == []


def test_loopback_is_allowed_only_by_the_testing_setting(
    receiver: WebhookReceiver, settings: Any
) -> None:
    settings.ALERTS_ALLOW_LOOPBACK = False
    with pytest.raises(outbound.Refused):
        outbound.post(receiver.url, b"{}", {})
    settings.ALERTS_ALLOW_LOOPBACK = True
    assert outbound.post(receiver.url, b"{}", {}).status == 200
    assert len(receiver.received) == 1
    # The setting opens loopback only, never the private ranges.
    with pytest.raises(outbound.Refused, match="private"):
        outbound.post("http://10.0.0.1/", b"{}", {})


def test_a_redirect_to_a_private_address_is_refused_before_connecting(
    loopback: Any, receiver: WebhookReceiver, connections: list[tuple[str, int]]
) -> None:
    receiver.state.redirects["/hook"] = "http://169.254.169.254/latest/meta-data/"
    with pytest.raises(outbound.Refused, match="169.254.169.254"):
        outbound.post(f"{receiver.url}/hook", b"{}", {})
    assert connections == [("127.0.0.1", receiver.port)]


def test_redirects_are_followed_a_few_times_only(loopback: Any, receiver: WebhookReceiver) -> None:
    for i in range(5):
        receiver.state.redirects[f"/r{i}"] = f"/r{i + 1}"
    with pytest.raises(outbound.Refused, match="more than 3 redirects"):
        outbound.post(f"{receiver.url}/r0", b"{}", {})
    assert len(receiver.received) == 4
    assert outbound.post(f"{receiver.url}/r2", b"{}", {}).status == 200  # r2 → r3 → r4 → r5


def test_the_vetted_address_is_what_we_connect_to_and_the_name_is_the_host_header(
    loopback: Any,
    receiver: WebhookReceiver,
    monkeypatch: pytest.MonkeyPatch,
    connections: list[tuple[str, int]],
) -> None:
    monkeypatch.setattr(outbound, "resolve", lambda host, port: ["127.0.0.1"])
    outbound.post(f"http://hooks.example.test:{receiver.port}/x", b"{}", {})
    assert connections == [("127.0.0.1", receiver.port)]
    assert receiver.received[0].headers["Host"] == f"hooks.example.test:{receiver.port}"


def test_a_silent_receiver_times_out_and_a_huge_answer_is_capped(
    loopback: Any, settings: Any
) -> None:
    settings.ALERTS_HTTP_TIMEOUT = 1
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        with pytest.raises(outbound.OutboundError, match="timed out|TimeoutError"):
            outbound.post(f"http://127.0.0.1:{silent.getsockname()[1]}/", b"{}", {})

    with socket.socket() as flood:
        flood.bind(("127.0.0.1", 0))
        flood.listen(1)

        def answer() -> None:
            conn, _ = flood.accept()
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n")
            with contextlib.suppress(OSError):  # the client stops reading at the cap
                conn.sendall(b"x" * 1_000_000)
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        response = outbound.post(f"http://127.0.0.1:{flood.getsockname()[1]}/", b"{}", {})
    assert len(response.body) == outbound.MAX_RESPONSE_BYTES


@pytest.fixture
def tls_receiver(tmp_path: Any, receiver: WebhookReceiver) -> tuple[WebhookReceiver, str]:
    """The receiver behind TLS with a self-signed certificate for hooks.example.test."""
    import ssl
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=hooks.example.test", "-addext", "subjectAltName=DNS:hooks.example.test",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    receiver.server.socket = server_tls.wrap_socket(receiver.server.socket, server_side=True)
    return receiver, str(cert)


def test_https_goes_to_the_vetted_address_with_the_name_for_sni_and_certificate(
    loopback: Any,
    tls_receiver: tuple[WebhookReceiver, str],
    monkeypatch: pytest.MonkeyPatch,
    connections: list[tuple[str, int]],
) -> None:
    import ssl

    receiver, ca = tls_receiver
    url = f"https://hooks.example.test:{receiver.port}/x"
    monkeypatch.setattr(outbound, "resolve", lambda host, port: ["127.0.0.1"])
    # An unknown certificate is an error (no verification is ever skipped) ...
    with pytest.raises(outbound.OutboundError, match="CERTIFICATE_VERIFY_FAILED"):
        outbound.post(url, b"{}", {})
    # ... and with the test CA trusted, the name checks out against the certificate.
    monkeypatch.setattr(outbound, "tls_context", lambda: ssl.create_default_context(cafile=ca))
    assert outbound.post(url, b"{}", {}).status == 200
    assert connections[-1] == ("127.0.0.1", receiver.port)
    assert receiver.received[-1].headers["Host"] == f"hooks.example.test:{receiver.port}"


def read_request(conn: socket.socket) -> bytes:
    """A whole request, its body too (a socket closed with data unread resets the client)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n")
         if line.lower().startswith(b"content-length:")),
        0,
    )  # fmt: skip
    while len(body) < length:
        body += conn.recv(65536)
    return data


def answering(reply: bytes, pause: float = 0.0) -> int:
    """A one-shot server on 127.0.0.1 that reads the request and sends `reply` line by line,
    `pause` seconds apart; its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def answer() -> None:
        with server:
            conn, _ = server.accept()
            with conn, contextlib.suppress(OSError):  # the client may hang up first
                read_request(conn)
                for line in reply.splitlines(keepends=True):
                    conn.sendall(line)
                    time.sleep(pause)

    threading.Thread(target=answer, daemon=True).start()
    return int(server.getsockname()[1])


def test_a_receiver_sending_its_answer_a_line_at_a_time_is_cut_off_at_the_deadline(
    loopback: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each line comes within the read timeout, but the whole answer may not take longer than
    TOTAL_SECONDS: the headers (where no read loop of ours can look at the clock) included."""
    settings.ALERTS_HTTP_TIMEOUT = 1
    monkeypatch.setattr(outbound, "TOTAL_SECONDS", 1.5)
    headers = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: 1\r\n" * 20 + b"Content-Length: 2\r\n\r\nok"
    started = time.monotonic()
    with pytest.raises(outbound.OutboundError, match="no whole answer within 2 s"):
        outbound.post(f"http://127.0.0.1:{answering(headers, pause=0.3)}/", b"{}", {})
    assert time.monotonic() - started < 3.0  # not the 6 s the answer takes
    body = b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n" + b"x\n" * 10
    with pytest.raises(outbound.OutboundError, match="no whole answer within 2 s"):
        outbound.post(f"http://127.0.0.1:{answering(body, pause=0.3)}/", b"{}", {})


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://" + "\u00e4" * 63 + ".com/hook", "cannot send to"),  # a label IDNA refuses
        ("http://[::1/hook", "not a URL"),
    ],
)
def test_a_url_that_cannot_be_sent_to_is_refused_not_a_crash(url: str, reason: str) -> None:
    with pytest.raises(outbound.Refused, match=reason):
        outbound.post(url, b"{}", {})


def test_a_redirect_to_what_is_not_a_url_is_refused(loopback: Any) -> None:
    reply = b"HTTP/1.1 302 Found\r\nLocation: http://[::1\r\nContent-Length: 0\r\n\r\n"
    with pytest.raises(outbound.Refused, match="a redirect to what is not a URL"):
        outbound.post(f"http://127.0.0.1:{answering(reply)}/", b"{}", {})
