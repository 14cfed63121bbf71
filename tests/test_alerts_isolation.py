"""One channel can never stop the others, nor evaluation (real servers on 127.0.0.1).

- A Slack stand-in that accepts connections and never answers: the running evaluator
  (``service.run``) still mails the alert through aiosmtpd within one evaluation interval, and
  keeps evaluating while the Slack send hangs.
- A channel with a broken setting (a NaN timeout, past the load-time validation) fails only its
  own messages; the error is recorded and ``gpuwatt alerts status`` shows it.
- Slack's payload escapes ``&``, ``<`` and ``>`` in names, so ``<!channel>`` cannot ping.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from test_alerts_helpers import SlackStandIn, SmtpServer, parts

from gpuwatt.alerts.clock import SystemClock
from gpuwatt.alerts.db import open_db
from gpuwatt.alerts.notify.email import EmailChannel
from gpuwatt.alerts.notify.slack import SlackChannel
from gpuwatt.alerts.outbox import PENDING, Outbox
from gpuwatt.alerts.rules import load_rules
from gpuwatt.alerts.service import Evaluator, run
from gpuwatt.model import GpuSample
from gpuwatt.store.sqlite import SqliteStore

NS = 1_000_000_000
EVALUATION_INTERVAL_S = 2.0
#: The hung Slack's own timeout: far longer than the email may take, short enough for the test
#: to let that send end (and close its socket) before the stand-in goes away.
SLACK_TIMEOUT_S = 8.0

RULES = """
rules:
  - name: GpuHot
    kind: threshold
    metric: temperature_gpu_c
    aggregation: avg
    window: 1m
    op: ">="
    threshold: 80
    for: 0s
    severity: critical
    summary: "{host} GPU {gpu} at {value:.0f} °C"
"""


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """Accepts TCP connections and never answers: a webhook that hangs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        yield f"http://127.0.0.1:{port}/services/T/B/hang"


def _hot_store(path: Path, host: str = "node-1") -> SqliteStore:
    store = SqliteStore(path)
    now = time.time_ns()
    store.write_samples(
        [
            GpuSample(
                time_ns=now - k * 5 * NS,
                host=host,
                gpu_index=0,
                uuid="GPU-hot",
                name="NVIDIA H100 80GB HBM3",
                temperature_gpu_c=91.0,
            )
            for k in range(6)
        ]
    )
    return store


def test_a_hung_slack_delays_neither_email_nor_evaluation(tmp_path: Path) -> None:
    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(RULES)
    con = open_db(tmp_path / "alerts.db")
    with (
        silent_server() as hung_url,
        SmtpServer("plain", None) as smtp,
        _hot_store(tmp_path / "store.db") as store,
    ):
        channels = {
            # listed first, so that a sequential delivery would wait for it first
            "slack": SlackChannel("slack", hung_url, timeout_s=SLACK_TIMEOUT_S),
            "email": EmailChannel("email", "127.0.0.1", smtp.port, "gpuwatt@example.org",
                                  ["oncall@example.org"], security="none", timeout_s=10.0),
        }  # fmt: skip
        ev = Evaluator(load_rules(rules_path), store, con, channels=channels, routes=[],
                       clock=SystemClock(), cluster="c1")  # fmt: skip
        evaluations: list[float] = []
        evaluate = ev.evaluate

        def counted() -> object:
            evaluations.append(time.monotonic())
            return evaluate()

        ev.evaluate = counted  # type: ignore[method-assign]
        stop = threading.Event()
        runner = threading.Thread(
            target=run, args=(ev,), kwargs={"evaluation_interval_s": EVALUATION_INTERVAL_S,
                                            "stop": stop, "shutdown_wait_s": 0.1},
            daemon=True,
        )  # fmt: skip
        started = time.monotonic()
        runner.start()
        try:
            deadline = started + 60
            while not smtp.messages and time.monotonic() < deadline:
                time.sleep(0.1)
            mailed_after_s = time.monotonic() - started
            assert smtp.messages, "the email never left while Slack hung"
            # The first evaluation runs one interval after start and fires (for: 0s); the email
            # leaves at the next delivery pass, within one more interval, Slack still hanging.
            assert mailed_after_s < 2 * EVALUATION_INTERVAL_S + 1.0 + 2.0, mailed_after_s
            assert mailed_after_s < SLACK_TIMEOUT_S  # Slack had not even given up yet
            time.sleep(3 * EVALUATION_INTERVAL_S)
            in_flight = [e for e in Outbox(con).entries(PENDING) if e.channel == "slack"]
        finally:
            stop.set()
            runner.join(60)  # run() waits for the hung send to time out
        con.close()
    assert not runner.is_alive()
    text, _ = parts(smtp.messages[0])
    assert "GPU 0 at 91" in text
    # Evaluation went on, at its interval, while the Slack send hung.
    assert len(evaluations) >= 3
    gaps = [b - a for a, b in itertools.pairwise(evaluations)]
    assert max(gaps) < 3 * EVALUATION_INTERVAL_S, gaps
    assert len(in_flight) == 1  # Slack's message is still owed, not lost


def test_a_broken_channel_fails_alone_and_says_why(tmp_path: Path) -> None:
    from test_cli import gpuwatt

    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(RULES)
    db = tmp_path / "alerts.db"
    con = open_db(db)
    with SlackStandIn() as slack, _hot_store(tmp_path / "store.db") as store:
        channels = {
            "email": EmailChannel("email", "127.0.0.1", 25, "gpuwatt@example.org",
                                  ["oncall@example.org"], timeout_s=float("nan")),
            "slack": SlackChannel("slack", slack.url),
        }  # fmt: skip
        ev = Evaluator(load_rules(rules_path), store, con, channels=channels, routes=[],
                       clock=SystemClock(), cluster="c1")  # fmt: skip
        ev.evaluate()
        report = ev.deliver()
        assert report.sent == 1 and report.retrying == 1
        assert len(slack.bodies) == 1
        (owed,) = Outbox(con).entries(PENDING)
        assert owed.channel == "email" and "ValueError" in owed.last_error
    con.close()
    config = tmp_path / "gpuwatt.yaml"
    config.write_text(f"alerts:\n  state_db: {db}\n")
    status = gpuwatt("alerts", "status", "--config", str(config), home=tmp_path)
    assert status.returncode == 0, status.stderr
    line = next(x for x in status.stdout.splitlines() if "to email" in x)
    assert line.startswith("RETRYING") and "ValueError" in line


def test_slack_escapes_names_so_nothing_pings(tmp_path: Path) -> None:
    rules_path = tmp_path / "rules.yaml"
    rules_path.write_text(RULES)
    con = open_db(tmp_path / "alerts.db")
    host = "<!channel> & <@U123>"
    with SlackStandIn() as slack, _hot_store(tmp_path / "store.db", host=host) as store:
        ev = Evaluator(load_rules(rules_path), store, con,
                       channels={"slack": SlackChannel("slack", slack.url)}, routes=[],
                       clock=SystemClock(), cluster="c1")  # fmt: skip
        ev.evaluate()
        ev.deliver()
        (body,) = slack.bodies
    con.close()
    import json

    text = json.dumps(body)
    assert "<!channel>" not in text and "<@U123>" not in text
    assert "&lt;!channel&gt; &amp; &lt;@U123&gt;" in body["text"]


def test_state_and_store_files_are_private(tmp_path: Path) -> None:
    import os
    import stat

    from gpuwatt.store import open_store

    old = os.umask(0o022)
    try:
        con = open_db(tmp_path / "new" / "alerts.db")
        con.execute("CREATE TABLE IF NOT EXISTS probe (x)")  # the WAL and its index exist now
        with open_store(f"sqlite:///{tmp_path}/data/gpuwatt.db") as store:
            store.write_samples([])
            files = [*(tmp_path / "new").iterdir(), *(tmp_path / "data").iterdir()]
            modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in files}
        con.close()
    finally:
        os.umask(old)
    assert {"alerts.db", "alerts.db-wal", "gpuwatt.db", "gpuwatt.db-wal"} <= set(modes)
    assert set(modes.values()) == {0o600}, modes
    for d in ("new", "data"):
        assert stat.S_IMODE((tmp_path / d).stat().st_mode) == 0o700
