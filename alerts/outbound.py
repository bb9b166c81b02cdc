"""The one HTTP client for user-supplied URLs (webhooks, Slack, Discord).

http/https only, short timeouts, a capped response, at most three redirects. The host is
resolved here and every address it resolves to must be public; the socket then connects to the
vetted address while the Host header and TLS SNI keep the name, so DNS cannot answer differently
between the check and the connect (rebinding). Each redirect goes through the same check.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from django.conf import settings

MAX_REDIRECTS = 3
MAX_RESPONSE_BYTES = 64 * 1024
#: A whole request, redirects included, ends by then: a slow receiver cannot hold a worker.
TOTAL_SECONDS = 15.0
REDIRECTS = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "CacheSafe-Alerts/1"
#: The well-known NAT64 prefix: behind a NAT64 gateway 64:ff9b::a00:1 reaches 10.0.0.1.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class OutboundError(Exception):
    """No usable answer (network error, timeout): a later attempt may succeed."""


class Refused(OutboundError):
    """We will not send there (scheme, address, redirects): a later attempt cannot succeed."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    url: str


def resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to: the only DNS lookup of this client."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def refusal(address: str) -> str | None:
    """Why we will not connect to `address`, or None when it is a public address."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(
        address.split("%", 1)[0]  # an IPv6 zone id ("fe80::1%eth0")
    )
    if isinstance(ip, ipaddress.IPv6Address):
        # IPv4 written as IPv6 (::ffff:10.0.0.1, 6to4, Teredo, NAT64) is judged as the IPv4 inside.
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            ip = embedded
    if ip.is_loopback and settings.ALERTS_ALLOW_LOOPBACK:
        return None
    for attribute, kind in (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_unspecified", "unspecified"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
        ("is_site_local", "site-local"),  # fec0::/10, deprecated but still routed inside sites
    ):
        if getattr(ip, attribute, False):
            return kind
    return None if ip.is_global else "non-public"


def literal_refusal(url: str) -> str | None:
    """Why a URL's host is refused when that shows without DNS (an IP literal, localhost)."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return None if settings.ALERTS_ALLOW_LOOPBACK else "loopback"
    try:
        return refusal(host)
    except ValueError:
        return None  # a name: judged at send time, after DNS


def vetted_address(host: str, port: int) -> str:
    """The address to connect to; raises Refused if any address of `host` is not public."""
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError) as exc:
        raise OutboundError(f"cannot resolve {host}: {exc}") from exc
    if not addresses:
        raise OutboundError(f"cannot resolve {host}")
    for address in addresses:
        kind = refusal(address)
        if kind is not None:
            # One private answer is enough: a name that mixes them is how rebinding starts.
            raise Refused(f"{host} resolves to {address}, a {kind} address: not allowed")
    return addresses[0]


class _VettedHTTPConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        address = vetted_address(self.host, self.port)
        self.sock = socket.create_connection((address, self.port), self.timeout)


class _VettedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=timeout, context=tls)
        self.tls = tls

    def connect(self) -> None:
        address = vetted_address(self.host, self.port)
        sock = socket.create_connection((address, self.port), self.timeout)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host)


def tls_context() -> ssl.SSLContext:
    """Certificates verified against the system's CAs, hostname checked (tests add their CA)."""
    return ssl.create_default_context()


def post(url: str, body: bytes, headers: Mapping[str, str]) -> Response:
    """POST `body` to a user-supplied URL; raises OutboundError / Refused."""
    return request("POST", url, body=body, headers=headers)


def request(
    method: str, url: str, *, body: bytes | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    """Send one request, following at most MAX_REDIRECTS redirects, each vetted again."""
    deadline = time.monotonic() + TOTAL_SECONDS
    sent_headers = {"User-Agent": USER_AGENT, **(headers or {})}
    for hop in range(MAX_REDIRECTS + 1):
        response = _send_once(method, url, body, sent_headers, deadline)
        location = response.headers.get("location")
        if response.status not in REDIRECTS or not location:
            return response
        if hop == MAX_REDIRECTS:
            raise Refused(f"more than {MAX_REDIRECTS} redirects (last to {location[:200]})")
        try:
            url = urljoin(url, location)
        except ValueError:  # "http://[::1": not a URL
            raise Refused(f"a redirect to what is not a URL ({location[:200]})") from None
        if response.status == 303 or (response.status in {301, 302} and method != "GET"):
            # What browsers do: the body is not sent on to the new location.
            method, body = "GET", None
            sent_headers = {k: v for k, v in sent_headers.items() if k.lower() != "content-type"}
    raise AssertionError("unreachable")


def _send_once(
    method: str, url: str, body: bytes | None, headers: Mapping[str, str], deadline: float
) -> Response:
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:
        raise Refused("not a URL") from None
    if parts.scheme not in {"http", "https"}:
        raise Refused(f"only http and https URLs are allowed, not {parts.scheme or 'none'}:")
    if not host:
        raise Refused("the URL has no host")
    if parts.username or parts.password:
        raise Refused("credentials in URLs are not sent")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise Refused("the URL has a bad port") from None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise OutboundError(f"no answer within {TOTAL_SECONDS:.0f} s")
    timeout = min(float(settings.ALERTS_HTTP_TIMEOUT), remaining)
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = _VettedHTTPSConnection(host, port, timeout, tls_context())
    else:
        conn = _VettedHTTPConnection(host, port, timeout=timeout)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    # Each read waits `timeout` at most, but a receiver that sends a header line or a byte
    # within each would hold the worker for ever: at the deadline the socket is shut.
    late = threading.Event()
    cut = threading.Timer(remaining, _hang_up, args=(conn, late))
    cut.daemon = True
    cut.start()
    try:
        conn.request(method, target, body=body, headers=dict(headers))
        answer = conn.getresponse()
        data = _read_capped(answer, deadline)
        if late.is_set():
            raise OutboundError(f"no whole answer within {TOTAL_SECONDS:.0f} s")
        return Response(
            status=answer.status,
            headers={k.lower(): v for k, v in answer.getheaders()},
            body=data,
            url=url,
        )
    except Refused:
        raise
    except (OSError, http.client.HTTPException) as exc:
        if late.is_set():
            raise OutboundError(f"no whole answer within {TOTAL_SECONDS:.0f} s") from exc
        raise OutboundError(f"{host}: {exc.__class__.__name__}: {exc}") from exc
    except ValueError as exc:  # a host IDNA cannot encode, a header http.client refuses
        raise Refused(f"cannot send to {host[:100]}: {exc}") from exc
    finally:
        cut.cancel()
        conn.close()


def _hang_up(conn: http.client.HTTPConnection, late: threading.Event) -> None:
    """Shut `conn`'s socket (its deadline passed): whatever read waits on it ends."""
    late.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # already closed
            sock.shutdown(socket.SHUT_RDWR)


def _read_capped(answer: http.client.HTTPResponse, deadline: float) -> bytes:
    """At most MAX_RESPONSE_BYTES of the body; the rest is never read."""
    chunks: list[bytes] = []
    size = 0
    while size < MAX_RESPONSE_BYTES:
        if time.monotonic() > deadline:
            raise OutboundError(f"no whole answer within {TOTAL_SECONDS:.0f} s")
        chunk = answer.read(min(8192, MAX_RESPONSE_BYTES - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
