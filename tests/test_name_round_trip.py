"""Any host, job or GPU name survives every path a name takes (a property over arbitrary Unicode).

Line protocol (encode, parse), the embedded store fed through the spool's path (``write_lines``),
a real InfluxDB 1.6.7 written through the store's own write path, the CSV report, the Slack
payload and the email message. The only transforms are documented ones: CSV neutralises a cell
that would start a formula (a leading ``'``), Slack escapes ``&``, ``<`` and ``>``, and a
notification shows a name's control characters as escapes (``printable``: a newline in a host
name must not break an email's lines).
"""

from __future__ import annotations

import csv
import email
import email.policy
import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuwatt.alerts.notify.base import AlertItem, Notification, printable
from gpuwatt.alerts.notify.email import render as render_email
from gpuwatt.alerts.notify.slack import render as render_slack
from gpuwatt.dashboard.csv_export import csv_lines
from gpuwatt.line_protocol import LineEncoder, decode_line
from gpuwatt.model import GpuSample
from gpuwatt.store.influx import InfluxStore
from gpuwatt.store.sqlite import SqliteStore

T0 = 1_700_000_000 * 1_000_000_000
# Any character a string can hold (not surrogates: they cannot be UTF-8), at least one of them.
NAMES = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40)
EXAMPLES = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _sample(host: str, job: str, gpu_name: str, uuid: str, k: int = 0) -> GpuSample:
    return GpuSample(
        time_ns=T0 + k,
        host=host,
        gpu_index=3,
        uuid=uuid,
        name=gpu_name,
        power_w=250.0,
        job_id=job,
    )


def _names(s: GpuSample) -> tuple[str, str, str, str | None]:
    return (s.host, s.name, s.uuid, s.job_id)


@given(host=NAMES, job=NAMES, gpu_name=NAMES, uuid=NAMES)
@EXAMPLES
def test_line_protocol(host: str, job: str, gpu_name: str, uuid: str) -> None:
    sample = _sample(host, job, gpu_name, uuid)
    (line,) = LineEncoder().encode_many([sample])
    assert "\n" not in line and "\r" not in line
    assert _names(decode_line(line)) == _names(sample)


@given(host=NAMES, job=NAMES, gpu_name=NAMES, uuid=NAMES)
@EXAMPLES
def test_embedded_store_through_the_spool_path(
    tmp_path: Path, host: str, job: str, gpu_name: str, uuid: str
) -> None:
    from gpuwatt.collector.spool import Spool

    sample = _sample(host, job, gpu_name, uuid)
    key = abs(hash((host, job, gpu_name, uuid)))
    spool = Spool(tmp_path / f"spool-{key}")
    spool.append(LineEncoder().encode_many([sample]))  # the collector's path: spool, then store
    batch = spool.read_batch()
    spool.close()
    path = tmp_path / f"{key}.db"
    with SqliteStore(path) as store:
        store.write_lines(batch.lines)
        (got,) = store.latest()
    path.unlink()
    assert _names(got) == _names(sample)


@pytest.mark.servers
def test_influxdb(influx_db) -> None:
    server, db = influx_db
    counter = iter(range(10**9))

    @given(host=NAMES, job=NAMES, gpu_name=NAMES, uuid=NAMES)
    @settings(max_examples=40, deadline=None)
    def check(host: str, job: str, gpu_name: str, uuid: str) -> None:
        server.query('DROP SERIES FROM "nvidia_smi"', db=db, method="POST")
        sample = _sample(host, job, gpu_name, uuid, next(counter))
        with InfluxStore(server.url, "", db, timeout_s=10) as store:
            store.write_samples([sample])
            (got,) = store.latest()
        assert _names(got) == _names(sample)

    check()


@pytest.mark.servers
def test_victoriametrics(victoria_metrics) -> None:
    """Through the store's own write path, the job id as a label (``with_info_line``)."""
    from dataclasses import replace

    from gpuwatt.store import open_store

    counter = iter(range(10**6))
    with open_store(victoria_metrics.url.replace("http://", "victoriametrics://")) as store:
        store.latest_lookback_s = 10 * 365 * 86400.0  # type: ignore[attr-defined]

        @given(host=NAMES, job=NAMES, gpu_name=NAMES, uuid=NAMES)
        @example(host="n 1", job='a job, "x"=1 \\ 100%\n', gpu_name="H100", uuid="GPU-1")
        @settings(max_examples=40, deadline=None)
        def check(host: str, job: str, gpu_name: str, uuid: str) -> None:
            k = next(counter)  # a GPU of its own: the engine keeps the earlier ones
            sample = replace(_sample(host, job, gpu_name, uuid, k), gpu_index=k)
            store.write_samples([sample])
            victoria_metrics.force_flush()
            (got,) = [s for s in store.latest() if s.gpu_index == k]
            assert _names(got) == _names(sample)

        check()


@given(host=NAMES, job=NAMES)
@EXAMPLES
def test_csv_report(host: str, job: str) -> None:
    text = "".join(csv_lines(["host", "job"], [(host, job)]))
    (_, row) = list(csv.reader(io.StringIO(text, newline="")))
    expected = [("'" + v if v.startswith(("=", "+", "-", "@", "\t", "\r")) else v)
                for v in (host, job)]  # fmt: skip
    assert row == expected


def _notification(host: str, job: str, gpu_name: str) -> Notification:
    item = AlertItem(
        fingerprint="f",
        status="firing",
        labels={"alertname": "GpuHot", "host": host, "gpu": "3", "gpu_name": gpu_name, "job": job},
        annotations={"summary": f"hot on {host} running {job}"},
        starts_ns=T0,
    )
    return Notification("c", "g", {"alertname": "GpuHot"}, "firing", (item,), T0)


@given(host=NAMES, job=NAMES, gpu_name=NAMES)
@EXAMPLES
def test_slack_payload(host: str, job: str, gpu_name: str) -> None:
    body = json.loads(json.dumps(render_slack(_notification(host, job, gpu_name))))

    def unescape(text: str) -> str:
        return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")

    for text in (body["text"], *(b["text"]["text"] for b in body["blocks"] if "text" in b)):
        assert "<!" not in text.replace("<http", "")  # nothing a name holds can ping
    fallback = unescape(body["text"])
    assert printable(f"hot on {host} running {job}") in fallback


@given(host=NAMES, job=NAMES, gpu_name=NAMES)
@EXAMPLES
def test_email_message(host: str, job: str, gpu_name: str) -> None:
    msg = render_email(_notification(host, job, gpu_name), "a@example.org", ["b@example.org"])
    parsed = email.message_from_bytes(msg.as_bytes(), policy=email.policy.default)
    text = parsed.get_body(("plain",)).get_content()  # type: ignore[union-attr]
    assert printable(f"hot on {host} running {job}") in text.replace("\r\n", "\n")
