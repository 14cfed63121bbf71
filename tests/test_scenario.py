"""Scenario files: the shipped ones load, selectors expand, and every mistake names its line."""

from __future__ import annotations

import textwrap

import pytest

from gpuwatt.collector.sim.scenario import (
    FAULT_PARAMS,
    GroundTruth,
    gpu_profile,
    list_shipped_scenarios,
    load_scenario,
    load_scenario_text,
)
from gpuwatt.errors import ConfigError
from gpuwatt.gpu_specs import SPECS, lookup

BASE = """\
name: t
cluster:
  nodes: 4
  gpus_per_node: 8
  model: H100 SXM
"""


def scenario(extra: str = "", base: str = BASE):
    return load_scenario_text(base + textwrap.dedent(extra), "t.yaml")


def config_error(extra: str, base: str = BASE) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        scenario(extra, base)
    assert info.value.path == "t.yaml"
    return info.value


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line of ``text`` containing ``needle``."""
    for n, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return n
    raise AssertionError(needle)


# --- shipped scenarios --------------------------------------------------------------------------


def test_shipped_scenarios_load_by_bare_name() -> None:
    assert {"demo", "healthy"} <= set(list_shipped_scenarios())
    for name in ("demo", "healthy"):
        s = load_scenario(name)
        assert s.name == name
        assert s.cluster.gpu_count == 32


def test_every_shipped_scenario_is_valid() -> None:
    for name in list_shipped_scenarios():
        assert load_scenario(name).name == name


def test_demo_shape_and_ground_truth() -> None:
    demo = load_scenario("demo")
    training = demo.job("llm-pretrain")
    assert training.kind == "training"
    assert len(training.gpus) == 24
    assert {h for h, _ in training.gpus} == {"node-0", "node-1", "node-2"}
    assert demo.job("chat-serving").gpus == tuple(("node-3", i) for i in range(7))
    assert demo.job("notebook-17").gpus == (("node-3", 7),)
    assert demo.ground_truth() == [
        GroundTruth("node-2", 5, "thermal_slowdown", 240.0, None, "llm-pretrain"),
        GroundTruth("node-3", 7, "idle_allocated", 0.0, None, "notebook-17", source="job"),
    ]


def test_healthy_has_nothing_to_find() -> None:
    healthy = load_scenario("healthy")
    assert healthy.faults == ()
    assert healthy.ground_truth() == []
    assert all(j.kind != "idle" for j in healthy.jobs)


def test_unknown_shipped_name_lists_the_shipped_ones() -> None:
    with pytest.raises(ConfigError, match="demo"):
        load_scenario("no-such-scenario")


def test_missing_file_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_scenario(tmp_path / "absent.yaml")


def test_load_from_a_path(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(BASE, encoding="utf-8")
    s = load_scenario(str(path))
    assert s.path == str(path)
    assert s.seed == 0 and s.jobs == () and s.faults == ()


# --- selectors and defaults ---------------------------------------------------------------------


def test_selectors_expand_in_order() -> None:
    s = scenario(
        """
        jobs:
          - {id: a, kind: training, gpus: ["node-[0-1]:0-1", "node-3:6"]}
          - {id: b, kind: inference, gpus: "node-3:0,2,4-5"}
          - {id: c, kind: idle, gpus: ["node-2:*"], start: 1m, end: 2m}
          - {id: d, kind: idle, gpus: ["*:7"], start: 2m}
        """
    )
    assert s.job("a").gpus == (
        ("node-0", 0),
        ("node-0", 1),
        ("node-1", 0),
        ("node-1", 1),
        ("node-3", 6),
    )
    assert s.job("b").gpus == (("node-3", 0), ("node-3", 2), ("node-3", 4), ("node-3", 5))
    assert len(s.job("c").gpus) == 8
    assert s.job("d").gpus == tuple((f"node-{n}", 7) for n in range(4))
    assert (s.job("c").start_s, s.job("c").end_s) == (60.0, 120.0)


def test_job_at_respects_time_windows() -> None:
    s = scenario(
        """
        jobs:
          - {id: early, kind: training, gpus: ["node-0:0"], start: 10, end: 20}
          - {id: late, kind: inference, gpus: ["node-0:0"], start: 20s}
        """
    )
    assert s.job_at("node-0", 0, 5) is None
    assert s.job_at("node-0", 0, 10).id == "early"
    assert s.job_at("node-0", 0, 20).id == "late"


def test_fault_defaults_are_filled_in() -> None:
    s = scenario(
        """
        faults:
          - {kind: thermal_slowdown, gpu: "node-1:2", start: 5m, end: 10m}
          - {kind: xid, gpu: "node-0:0", start: 90s, code: 79}
        """
    )
    thermal, xid = s.faults
    assert thermal.params == FAULT_PARAMS["thermal_slowdown"]
    assert (thermal.start_s, thermal.end_s) == (300.0, 600.0)
    assert xid.params == {"code": 79}
    truth = s.ground_truth()
    assert truth[1].start_s == truth[1].end_s == 90.0  # an instant


def test_every_profile_name_maps_back_to_its_model() -> None:
    for model in SPECS:
        name = gpu_profile(model).nvml_name
        spec = lookup(name)
        assert spec is not None and spec.model == model, (model, name)


# --- errors name the line -----------------------------------------------------------------------


def test_bad_yaml_names_the_line() -> None:
    err = config_error("jobs:\n  - {id: a, kind: training\n")
    assert err.line is not None and err.line >= 7
    assert "invalid YAML" in err.message


def job(kind: str = "training", gpus: str = "node-0:0", more: str = "") -> str:
    return f"jobs:\n  - id: a\n    kind: {kind}\n    gpus: {gpus}\n{more}"


def fault(kind: str, gpu: str = "node-1:1", more: str = "") -> str:
    return f"faults:\n  - kind: {kind}\n    gpu: {gpu}\n{more}"


TWO_JOBS = "jobs:\n  - {id: a, kind: idle, gpus: node-0:0}\n  - {id: %s, kind: idle, gpus: %s}\n"


@pytest.mark.parametrize(
    ("extra", "needle", "message"),
    [
        ("colour: blue\n", "colour", "unknown field 'colour'"),
        (job(more="    start_s: 5\n"), "start_s", "unknown field"),
        (job(kind="painting"), "painting", "not one of"),
        (job(gpus="node-0:8"), "node-0:8", "out of range"),
        (job(gpus="[node-0:0, node-9:1]"), "node-9", "no host"),
        (job(gpus="node0"), "node0", "bad GPU selector"),
        (job(gpus="node-0:7-3"), "7-3", "backwards"),
        (job(more="    start: soon\n"), "soon", "bad duration"),
        (job(more="    start: 5m\n    end: 2m\n"), "end: 2m", "must be after start"),
        (job(kind="inference", more="    step_time: 1s\n"), "step_time", "only to training"),
        (job(more="    intensity: 1.5\n"), "intensity", "at most"),
        (TWO_JOBS % ("a", "node-0:1"), "node-0:1", "duplicate job id"),
        (TWO_JOBS % ("b", "'node-0:*'"), "id: b", "already in job 'a'"),
        (job(gpus="[node-0:0, node-0:0-1]"), "node-0:0-1", "listed twice"),
        (fault("meltdown"), "meltdown", "not one of"),
        (fault("xid", "node-7:0", "    code: 79\n"), "node-7", "no host"),
        (fault("xid", "node-1:12", "    code: 79\n"), "node-1:12", "out of range"),
        (fault("xid"), "kind: xid", "missing required field 'code'"),
        (fault("xid", more="    code: 79\n    end: 5m\n"), "end: 5m", "unknown field 'end'"),
        (fault("gpu_lost", "'node-1:*'"), "node-1:*", "names one GPU"),
        (fault("thermal_slowdown", more="    code: 3\n"), "code: 3", "unknown field"),
        (fault("ecc_errors", more="    sbe_per_h: lots\n"), "lots", "expected a number"),
        (fault("power_brake", more="    start: 1m\n    end: 30s\n"), "end: 30s", "after start"),
    ],
)
def test_mistakes_name_the_offending_line(extra: str, needle: str, message: str) -> None:
    err = config_error(extra)
    assert message in err.message
    assert err.line == line_of(BASE + extra, needle), err


def test_unknown_model_names_its_line() -> None:
    base = BASE.replace("H100 SXM", "H900 Ultra")
    err = config_error("", base)
    assert "unknown GPU model 'H900 Ultra'" in err.message
    assert err.line == line_of(base, "H900")


def test_missing_cluster_field_names_the_cluster_line() -> None:
    base = "name: t\ncluster:\n  nodes: 2\n  model: H100 SXM\n"
    err = config_error("", base)
    assert "gpus_per_node" in err.message
    assert err.line == 3  # the cluster mapping starts on its first key


def test_wrong_type_names_the_line() -> None:
    err = config_error("", BASE.replace("nodes: 4", "nodes: four"))
    assert "expected an integer" in err.message
    assert err.line == 3


def test_str_of_error_is_file_colon_line() -> None:
    err = config_error("colour: blue\n")
    assert str(err).startswith("t.yaml:6: ")
