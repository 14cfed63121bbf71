"""Acceptance 5: malformed rules are rejected at start with the file, the line and the reason;
the CLI exits non-zero. Shipped rules load; channel secrets never come from the config text."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_alerts_helpers import SlackStandIn

from gpuwatt.alerts.rules import load_rules, validate_rules_file
from gpuwatt.alerts.settings import parse_alert_settings
from gpuwatt.cli.alerts import main
from gpuwatt.errors import ConfigError
from gpuwatt.yamlfile import load_text

GOOD = """rules:
  - name: Hot
    kind: threshold
    metric: temperature_gpu_c
    window: 1m
    op: ">"
    threshold: 85
    summary: "{host} GPU {gpu} hot"
"""


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("rules:\n  - name: Hot\n    kind: [threshold\n", 4, "invalid YAML"),
        (GOOD.replace("    op:", "    colour: red\n    op:"), 6, "unknown field 'colour'"),
        (GOOD.replace("temperature_gpu_c", "temperature_c"), 4,
         "unknown metric 'temperature_c' (did you mean temperature_gpu_c"),
        (GOOD.replace("window: 1m", "window: 5 minutes"), 5, "bad duration '5 minutes'"),
        (GOOD.replace('op: ">"', 'op: "=>"'), 6, "'=>' is not one of"),
        (GOOD.replace("{gpu} hot", "{gpuu} hot"), 8, "unknown placeholder {gpuu}"),
        (GOOD + GOOD.removeprefix("rules:\n"), 9, "duplicate rule name 'Hot'"),
    ],
)  # fmt: skip
def test_malformed_rules_name_file_line_reason(
    tmp_path: Path, text: str, line: int, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        validate_rules_file(path)
    assert (info.value.path, info.value.line) == (str(path), line)
    assert reason in info.value.message
    assert main(["alerts", "--rules", str(path), "--store", f"sqlite:///{tmp_path}/s.db"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuwatt: {path}:{line}: ") and reason in err


def test_shipped_rules_load_and_validate() -> None:
    rules = load_rules()
    assert [r.name for r in rules] == [
        "GpuTemperatureHigh", "GpuHardwareSlowdown", "GpuCriticalXid", "GpuEccDoubleBitErrors",
        "GpuRowRemapFailure", "GpuLostOrMissing", "CollectorDown", "GpuMemoryNearlyFull",
        "GpuIdleAllocated", "GpuStraggler",
    ]  # fmt: skip
    assert all(r.runbook_url.startswith("https://") for r in rules)
    from gpuwatt.alerts.rules import DEFAULT_RULES_PATH

    assert validate_rules_file(DEFAULT_RULES_PATH) == "alert rules: 10"


def test_secrets_come_from_env_or_file_never_the_config(tmp_path: Path) -> None:
    literal = "alerts:\n  channels:\n    s: {type: slack, webhook_url: 'https://hooks/x'}\n"
    with pytest.raises(ConfigError) as info:
        parse_alert_settings(load_text(literal, "c.yaml").get("alerts"), {})
    assert info.value.line == 3 and "webhook_url_env" in info.value.message
    missing = "alerts:\n  channels:\n    s: {type: slack, webhook_url_env: SLACK_URL}\n"
    with pytest.raises(ConfigError) as info:
        parse_alert_settings(load_text(missing, "c.yaml").get("alerts"), {})
    assert "SLACK_URL is not set" in info.value.message
    secret = tmp_path / "smtp_password"
    secret.write_text("pw-from-file\n")
    mail = (
        "alerts:\n  channels:\n    m:\n      type: email\n      host: smtp.example.org\n"
        f"      username: u\n      password_file: {secret}\n      from: a@example.org\n"
        "      to: [b@example.org]\n"
    )
    settings = parse_alert_settings(load_text(mail, "c.yaml").get("alerts"), {})
    channel = settings.channels["m"]
    assert channel.password == "pw-from-file" and channel.port == 587  # type: ignore[attr-defined]
    assert "pw-from-file" not in repr(channel)


def test_cli_alerts_test_sends_a_test_notification(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with SlackStandIn() as slack:
        monkeypatch.setenv("TEST_SLACK_URL", slack.url)
        cfg = tmp_path / "gpuwatt.yaml"
        cfg.write_text(
            f"alerts:\n  state_db: {tmp_path}/alerts.db\n"
            "  channels:\n    ops: {type: slack, webhook_url_env: TEST_SLACK_URL}\n"
        )
        store = f"sqlite:///{tmp_path}/s.db"
        assert main(["alerts", "test", "--channel", "ops", "--config", str(cfg),
                     "--store", store]) == 0  # fmt: skip
        assert main(["alerts", "test", "--channel", "nope", "--config", str(cfg),
                     "--store", store]) == 2  # fmt: skip
        bodies = slack.bodies
    out, err = capsys.readouterr()
    assert "ops: Delivered" in out and "no channel named 'nope' (ops)" in err
    assert slack.url not in out + err
    assert len(bodies) == 1 and bodies[0]["text"].startswith("[TEST] gpuwatt test notification")
