"""``gpuwatt report`` and ``gpuwatt dashboard`` through their own parsers."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import pytest
from test_dashboard_support import DEMO_END_NS, build_demo_store

from gpuwatt.cli.dashboard import (
    add_dashboard_parser,
    add_job_parser,
    add_report_parser,
    report_query,
)
from gpuwatt.errors import ConfigError, GpuwattError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuwatt")
    sub = p.add_subparsers(dest="command", required=True)
    add_dashboard_parser(sub)
    add_report_parser(sub)
    add_job_parser(sub)
    return p


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cli") / "demo.db"
    build_demo_store(path, minutes=10).close()
    return f"sqlite://{path}"


def test_dashboard_defaults() -> None:
    args = parser().parse_args(["dashboard"])
    assert (args.host, args.port, args.store, args.config) == ("127.0.0.1", 8050, None, None)


@pytest.mark.parametrize("by", ["gpu", "node", "job"])
def test_report_writes_csv(store_url: str, tmp_path: Path, by: str) -> None:
    out = tmp_path / f"r-{by}.csv"
    args = parser().parse_args(
        ["report", "--store", store_url, "--from", "2026-01-01T00:10:00Z",
         "--to", "2026-01-01T00:20:00Z", "--by", by, "--out", str(out)]
    )  # fmt: skip
    assert args.func(args) == 0
    rows = list(csv.reader(out.read_text().splitlines()))
    assert "energy_kwh" in rows[0]
    assert len(rows) - 1 == {"gpu": 32, "node": 4, "job": 3}[by]


def test_report_duration_and_bad_range(store_url: str, tmp_path: Path) -> None:
    assert report_query("2h", "") == {"range": "2h"}
    assert report_query("2026-01-01", "2026-01-02") == {"from": "2026-01-01", "to": "2026-01-02"}
    args = parser().parse_args(
        ["report", "--store", store_url, "--from", "2026-01-02", "--to", "2026-01-01",
         "--out", str(tmp_path / "x.csv")]
    )  # fmt: skip
    with pytest.raises(GpuwattError, match="ends before it starts"):
        args.func(args)
    assert not (tmp_path / "x.csv").exists()


def test_dashboard_refuses_public_bind_without_credentials(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("GPUWATT_DASHBOARD_USER", "GPUWATT_DASHBOARD_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("GPUWATT_DASHBOARD_PASSWORD_FILE", raising=False)
    args = parser().parse_args(["dashboard", "--store", store_url, "--host", "0.0.0.0"])
    with pytest.raises(ConfigError, match=r"refusing to serve the dashboard on 0\.0\.0\.0"):
        args.func(args)


RANGE = ["--from", "2026-01-01T00:10:00Z", "--to", "2026-01-01T00:20:00Z"]


@pytest.fixture(scope="module")
def steps_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The demo with its training job's steps and its inference job's requests reported."""
    path = tmp_path_factory.mktemp("cli-steps") / "demo.db"
    build_demo_store(path, minutes=10, job_steps=True).close()
    return f"sqlite://{path}"


def _report_by_job(url: str, tmp_path: Path) -> dict[str, dict[str, str]]:
    out = tmp_path / "jobs.csv"
    args = parser().parse_args(["report", "--store", url, *RANGE, "--by", "job", "--out", str(out)])
    assert args.func(args) == 0
    return {r["job_id"]: r for r in csv.DictReader(out.read_text().splitlines())}


def test_report_by_job_has_the_jobs_page_columns(steps_url: str, tmp_path: Path) -> None:
    from gpuwatt.dashboard.job_report import EXTRA_COLUMNS

    jobs = _report_by_job(steps_url, tmp_path)
    assert set(jobs) == {"llm-pretrain", "chat-serving", "notebook-17"}
    assert all(c in jobs["llm-pretrain"] for c in EXTRA_COLUMNS)
    train, serve = jobs["llm-pretrain"], jobs["chat-serving"]
    assert int(train["stragglers"]) == 1 and float(train["mfu_pct"]) > 0
    assert "straggler" in train["verdict"].lower()
    assert serve["requests"] and not train["requests"]
    per_k = float(serve["energy_kwh"]) * 1e6 / float(serve["requests"])
    assert float(serve["energy_per_1k_requests_wh"]) == pytest.approx(per_k, rel=1e-6)
    assert float(serve["latency_p50_s"]) <= float(serve["latency_p99_s"])


def test_dashboard_download_by_job_is_the_cli_report_by_job(steps_url: str, tmp_path: Path) -> None:
    """One function builds both: the same rows and columns, the jobs page's included."""
    from gpuwatt.config import load_config
    from gpuwatt.dashboard.app import create_app
    from gpuwatt.store.job_steps import SqliteJobStepStore
    from gpuwatt.store.sqlite import SqliteStore

    cli = _report_by_job(steps_url, tmp_path)
    path = steps_url.removeprefix("sqlite://")
    store, steps = SqliteStore(path), SqliteJobStepStore(path)
    try:
        config = load_config(None)  # as the CLI loads it: the same tariff
        app = create_app(store, now_ns=DEMO_END_NS, job_steps=steps, config=config)
        query = "from=2026-01-01T00:10:00Z&to=2026-01-01T00:20:00Z&by=job"
        resp = app.server.test_client().get(f"/download/report.csv?{query}")
        assert resp.status_code == 200
        text = resp.get_data(as_text=True)
    finally:
        steps.close()
        store.close()
    served = {r["job_id"]: r for r in csv.DictReader(text.splitlines())}
    assert served == cli
    assert float(served["llm-pretrain"]["mfu_pct"]) > 0
    assert float(served["chat-serving"]["energy_per_1k_requests_wh"]) > 0


def test_job_summary_for_a_ticket(
    steps_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwatt.dashboard import format as fmt

    jobs = _report_by_job(steps_url, tmp_path)
    args = parser().parse_args(["job", "llm-pretrain", "--store", steps_url, *RANGE])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert text.startswith("gpuwatt job llm-pretrain (")
    assert jobs["llm-pretrain"]["verdict"] in text
    assert fmt.energy_kwh(float(jobs["llm-pretrain"]["energy_kwh"])) in text
    assert "GPU 5 on node-2 runs at" in text  # the straggler, explained
    args = parser().parse_args(["job", "chat-serving", "--store", steps_url, *RANGE])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    per_k = float(jobs["chat-serving"]["energy_per_1k_requests_wh"])
    assert f"per 1k req.    {fmt.si(per_k, 'Wh')}" in text
    assert "latency        p50 " in text and "stragglers     none" in text
    args = parser().parse_args(["job", "nope", "--store", steps_url, *RANGE])
    with pytest.raises(GpuwattError, match=r"no job 'nope'.*llm-pretrain"):
        args.func(args)
