"""The ``gpuwatt_job_step`` measurement: application-reported work, its names and its codec."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuwatt.line_protocol import (
    STR_ESCAPES,
    LineProtocolError,
    decode_name,
    escape_tag,
    parse_line,
)
from gpuwatt.schema import TAG_HOST

if TYPE_CHECKING:
    import pandas as pd

#
# A training job reports each optimizer step (``gpuwatt.work.WorkReporter``): how long it took and
# how many model FLOPs it did, so the analytics can put a true MFU beside the counter estimate.
#
# - Tags ``host``, ``job_id``, ``rank``. Unlike ``nvidia_smi`` (where the job id is a *field*, see
#   FIELD_JOB_ID), the job id is a tag here: every point of this measurement belongs to exactly one
#   job, and reads always select by job. The cost is one series per (host, job, rank): a site
#   running 1,000 jobs a day whose jobs report from every one of 64 ranks adds 64,000 series a day
#   (1,000 a day when only rank 0 reports, which is enough: ``model_flops_per_step`` is the job's
#   total). Give the bucket a retention, or report from rank 0 only, where that matters.
# - ``step`` (int): the optimizer step number. ``step_time_s`` (float, s): wall time of the step
#   on this rank, forward + backward + optimizer + communication.
# - ``model_flops_per_step`` (float, FLOP): the *job's total* model FLOPs per optimizer step, over
#   all ranks (the global batch): for a dense transformer ~6 x parameters x tokens per step
#   (PaLM's MFU definition: model FLOPs, not hardware FLOPs, so activation recomputation does not
#   count). Every rank that reports sends the same job total; the analytics count each step once.
# - ``tokens_per_step`` (float, optional): tokens in the global batch per step.
# - ``gpu_uuids`` (string, optional): the GPUs of this rank, comma-separated NVML UUIDs
#   (``GPU-...``), or ``host:index`` where the UUID is not known.
# - ``precision`` (string, optional): the tensor precision of the model's matmuls (one of
#   ``gpu_specs.TENSOR_PRECISIONS``); it picks the peak MFU is measured against.
# The point's time is the end of the step (ns).

JOB_STEP_MEASUREMENT = "gpuwatt_job_step"
TAG_JOB_ID = "job_id"
TAG_RANK = "rank"
JOB_STEP_TAGS: tuple[str, ...] = (TAG_HOST, TAG_JOB_ID, TAG_RANK)
FIELD_STEP = "step"
FIELD_STEP_TIME_S = "step_time_s"
FIELD_MODEL_FLOPS_PER_STEP = "model_flops_per_step"
FIELD_TOKENS_PER_STEP = "tokens_per_step"
FIELD_GPU_UUIDS = "gpu_uuids"
FIELD_PRECISION = "precision"
JOB_STEP_FIELDS: tuple[str, ...] = (
    FIELD_STEP,
    FIELD_STEP_TIME_S,
    FIELD_MODEL_FLOPS_PER_STEP,
    FIELD_TOKENS_PER_STEP,
    FIELD_GPU_UUIDS,
    FIELD_PRECISION,
)
#: Columns of a job-step frame (``JobStepStore.job_steps``), in order.
JOB_STEP_COLUMNS: tuple[str, ...] = ("time_ns", *JOB_STEP_TAGS, *JOB_STEP_FIELDS)


@dataclass(frozen=True, slots=True)
class JobStep:
    """One optimizer step of one rank of a job, as the job reports it (see the notes above)."""

    time_ns: int  # end of the step
    job_id: str
    rank: int
    step: int
    step_time_s: float
    model_flops_per_step: float | None = None  # the job's total over all ranks, FLOP
    tokens_per_step: float | None = None
    gpu_uuids: tuple[str, ...] = ()
    precision: str | None = None
    host: str = ""


def job_steps_frame(steps: Iterable[JobStep]) -> pd.DataFrame:
    """Steps as a frame of ``JOB_STEP_COLUMNS`` in the given order (``gpu_uuids``
    comma-separated; the flops and tokens columns float even where every value is None)."""
    import pandas as pd

    df = pd.DataFrame(
        [
            (s.time_ns, s.host, s.job_id, s.rank, s.step, s.step_time_s, s.model_flops_per_step,
             s.tokens_per_step, ",".join(s.gpu_uuids), s.precision)
            for s in steps
        ],
        columns=list(JOB_STEP_COLUMNS),
    )  # fmt: skip
    return df.astype({FIELD_MODEL_FLOPS_PER_STEP: float, FIELD_TOKENS_PER_STEP: float})


def _lp_float(value: float) -> str:
    """Shortest exact text of a float (line protocol accepts ``1e+15``)."""
    return repr(float(value))


def encode_job_step(s: JobStep) -> str:
    """One ``gpuwatt_job_step`` line (precision ns). Non-finite optional fields are left out."""
    if not s.job_id:
        raise ValueError("a job step needs a job_id")
    if not math.isfinite(s.step_time_s):
        raise ValueError(f"step_time_s must be finite, got {s.step_time_s!r}")
    tags = [JOB_STEP_MEASUREMENT]
    if s.host:
        tags.append(f"{TAG_HOST}={escape_tag(s.host)}")
    tags.append(f"{TAG_JOB_ID}={escape_tag(s.job_id)}")
    tags.append(f"{TAG_RANK}={int(s.rank)}")
    fields_ = [f"{FIELD_STEP}={int(s.step)}i", f"{FIELD_STEP_TIME_S}={_lp_float(s.step_time_s)}"]
    for name, v in (
        (FIELD_MODEL_FLOPS_PER_STEP, s.model_flops_per_step),
        (FIELD_TOKENS_PER_STEP, s.tokens_per_step),
    ):
        if v is not None and math.isfinite(v):
            fields_.append(f"{name}={_lp_float(v)}")
    if s.gpu_uuids:
        text = ",".join(s.gpu_uuids).translate(STR_ESCAPES)
        fields_.append(f'{FIELD_GPU_UUIDS}="{text}"')
    if s.precision:
        fields_.append(f'{FIELD_PRECISION}="{s.precision.translate(STR_ESCAPES)}"')
    return f"{','.join(tags)} {','.join(fields_)} {int(s.time_ns)}"


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def job_step_from_fields(time_ns: int, tags: dict[str, str], values: dict[str, Any]) -> JobStep:
    """Build a job step from stored tags and fields (line protocol, InfluxQL rows)."""
    uuids = values.get(FIELD_GPU_UUIDS)
    precision = values.get(FIELD_PRECISION)
    return JobStep(
        time_ns=int(time_ns),
        job_id=decode_name(tags.get(TAG_JOB_ID, "")),
        rank=int(tags.get(TAG_RANK) or 0),
        step=int(values[FIELD_STEP]),
        step_time_s=float(values[FIELD_STEP_TIME_S]),
        model_flops_per_step=_opt_float(values.get(FIELD_MODEL_FLOPS_PER_STEP)),
        tokens_per_step=_opt_float(values.get(FIELD_TOKENS_PER_STEP)),
        gpu_uuids=tuple(filter(None, str(uuids).split(","))) if uuids else (),
        precision=str(precision) if precision else None,
        host=decode_name(tags.get(TAG_HOST, "")),
    )


def decode_job_step(line: str) -> JobStep:
    """Parse one ``gpuwatt_job_step`` line back into a ``JobStep``."""
    measurement, tags, values, time_ns = parse_line(line)
    if measurement != JOB_STEP_MEASUREMENT:
        raise LineProtocolError(f"unexpected measurement {measurement!r}")
    missing = [f for f in (FIELD_STEP, FIELD_STEP_TIME_S) if f not in values]
    if missing or TAG_JOB_ID not in tags:
        raise LineProtocolError(f"job step without {missing or [TAG_JOB_ID]}")
    return job_step_from_fields(time_ns, tags, values)
