"""Real servers on 127.0.0.1 for the alert tests: a scripted Slack stand-in (http.server), an
aiosmtpd SMTP server (STARTTLS + AUTH, implicit TLS, or plain) with a self-signed certificate,
and a driver that runs a simulated cluster into a SqliteStore under an injected clock.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpuwatt.alerts.clock import NS_PER_S, ManualClock
from gpuwatt.alerts.service import Evaluator
from gpuwatt.store.base import Store

SMTP_USER = "gpuwatt"
SMTP_PASSWORD = "s3cret-pw"
T0_NS = 1_750_000_000 * NS_PER_S  # 2025-06-15: realistic timestamps in payloads


# --- Slack stand-in ---------------------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: str = "ok"
    headers: dict[str, str] = field(default_factory=dict)


class SlackStandIn:
    """Answers POSTs from a script of replies (then 200 ok) and records every request."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with outer.lock:
                    outer.requests.append({"path": self.path, "json": body})
                    reply = outer.script.pop(0) if outer.script else Reply()
                data = reply.body.encode()
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/services/T000/B000/XXXXSECRETXXXX"

    def __enter__(self) -> SlackStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r["json"] for r in self.requests]


# --- SMTP -------------------------------------------------------------------------------------


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost; returns (cert, key) paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuwatt-test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mailbox:
    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.auth_logins: list[str] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        msg = message_from_bytes(envelope.original_content, policy=policy.default)
        self.messages.append(msg)  # type: ignore[arg-type]
        return "250 OK"

    def authenticator(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login.decode() == SMTP_USER
            and auth_data.password.decode() == SMTP_PASSWORD
        )
        if ok:
            self.auth_logins.append(auth_data.login.decode())
        return AuthResult(success=ok, handled=False)


class _QuietController(Controller):
    def factory(self):  # type: ignore[no-untyped-def]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Requiring AUTH while not requiring TLS")
            return super().factory()


class SmtpServer:
    """aiosmtpd on 127.0.0.1: mode 'starttls' (AUTH required, only after STARTTLS), 'tls'
    (implicit TLS, AUTH required) or 'plain'. Can be stopped and started again on its port."""

    def __init__(self, mode: str, cert: tuple[Path, Path] | None, port: int | None = None):
        self.mode = mode
        self.cert = cert
        self.port = port or free_port()
        self.mailbox = Mailbox()
        self.controller: Controller | None = None

    def _context(self) -> ssl.SSLContext:
        assert self.cert is not None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*self.cert)
        return ctx

    def start(self) -> SmtpServer:
        kw: dict[str, Any] = {}
        if self.mode == "starttls":
            kw = {
                "tls_context": self._context(),
                "require_starttls": True,
                "authenticator": self.mailbox.authenticator,
                "auth_required": True,
                "auth_require_tls": True,
            }
        elif self.mode == "tls":
            kw = {
                "ssl_context": self._context(),
                "authenticator": self.mailbox.authenticator,
                "auth_required": True,
                # aiosmtpd 1.4 counts only STARTTLS as TLS for AUTH; the whole session is TLS
                # here, so AUTH must not require STARTTLS (its warning does not apply)
                "auth_require_tls": False,
            }
        self.controller = _QuietController(
            self.mailbox, hostname="127.0.0.1", port=self.port, ready_timeout=10, **kw
        )
        self.controller.start()
        return self

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    def __enter__(self) -> SmtpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def messages(self) -> list[EmailMessage]:
        return self.mailbox.messages


def parts(msg: EmailMessage) -> tuple[str, str]:
    """(text, html) of a multipart/alternative message."""
    text = msg.get_body(("plain",))
    html = msg.get_body(("html",))
    assert text is not None and html is not None
    return (
        text.get_content().replace("\r\n", "\n"),  # type: ignore[attr-defined]
        html.get_content().replace("\r\n", "\n"),  # type: ignore[attr-defined]
    )


# --- driving a simulated cluster --------------------------------------------------------------


def drive(
    evaluator: Evaluator,
    source: Any,
    store: Store,
    clock: ManualClock,
    *,
    from_s: float,
    until_s: float,
    sample_every_s: float = 5.0,
    evaluate_every_s: float = 15.0,
    skip_hosts: frozenset[str] = frozenset(),
) -> Iterator[float]:
    """Sample the simulated cluster into the store and evaluate/deliver on the injected clock.
    Yields the simulated time after each evaluation (a test may act between steps)."""
    t = from_s
    k = round(from_s / sample_every_s)
    every = round(evaluate_every_s / sample_every_s)
    while t <= until_s:
        now_ns = source.start_ns + round(t * NS_PER_S)
        samples = source.sample_at(now_ns, include_slow=k % 12 == 0)
        store.write_samples([s for s in samples if s.host not in skip_hosts])
        if k % every == 0:
            clock.set_ns(now_ns)
            evaluator.evaluate()
            evaluator.deliver()
            yield t
        t += sample_every_s
        k += 1


def test_cert_and_free_port(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.load_verify_locations(cafile=str(cert))
    assert key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY")
    assert 1024 < free_port() < 65536
