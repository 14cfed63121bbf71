"""Report a training job's work to gpuwatt: step time and model FLOPs per step.

With it the analytics show a true MFU and the application's own TFLOPS beside the GPU-counter
estimate. Stdlib and the gpuwatt core only (no pandas, no numpy on this path)::

    from gpuwatt.work import WorkReporter

    flops = 6 * n_params * tokens_per_step  # the whole job's, per optimizer step
    reporter = WorkReporter("llm-pretrain-42", rank=rank, model_flops_per_step=flops)
    for batch in loader:
        with reporter.timed_step():
            train_step(batch)
    reporter.close()

``model_flops_per_step`` is the job's *total* model FLOPs per optimizer step, over all ranks (see
``gpuwatt.schema``'s notes on ``gpuwatt_job_step``); one rank reporting is enough.

An inference server reports the requests it served, each with its latency and the tokens it
produced; the dashboard then shows energy and cost per 1,000 requests and per million tokens, and
latency percentiles (the "cost per inference" hardware is compared by)::

    reporter = WorkReporter("chat-serving", rank=replica)
    t0 = time.perf_counter()
    reply = generate(prompt)
    reporter.request(time.perf_counter() - t0, tokens=len(reply.tokens))

A request is kept as one step (``step_time_s`` its latency, ``tokens_per_step`` its tokens, no
model FLOPs), so report every request of the replica: a sample of them undercounts the
requests the energy is divided by. Each replica reports under its own ``rank``.

The training loop is never slowed down nor broken by reporting: ``step()`` appends to a bounded
in-memory buffer and returns; a daemon thread writes the buffer to the store every
``flush_interval_s``. While the store is unreachable the buffer keeps the newest ``max_buffer``
steps (older ones are dropped and counted); failures are counted and logged once (and once more
when delivery resumes). ``close()`` (also run at interpreter exit) delivers what is left, waiting
at most ``close_timeout_s``.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gpuwatt.job_step_format import JobStep
from gpuwatt.store.job_steps import JobStepStore, open_job_step_store

log = logging.getLogger(__name__)

NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class ReporterStats:
    recorded: int  # steps accepted by step()
    delivered: int  # steps the store acknowledged
    dropped: int  # steps lost: the buffer was full (oldest first) or close() timed out
    failures: int  # failed write attempts (each is retried)
    buffered: int  # steps waiting to be written
    last_error: str | None


def gpus_from_environment(environ: Mapping[str, str], host: str) -> tuple[str, ...]:
    """This process's GPUs from ``CUDA_VISIBLE_DEVICES``: UUIDs as they are; indices as
    ``host:index`` only when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (CUDA's default order is not
    NVML's); anything else (MIG UUIDs, unset): none, and the analytics use the collector's job
    attribution instead."""
    visible = [v.strip() for v in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and all(v.startswith("GPU-") for v in visible):
        return tuple(visible)
    if (
        visible
        and all(v.isdigit() for v in visible)
        and environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    ):
        return tuple(f"{host}:{v}" for v in visible)
    return ()


class WorkReporter:
    """Buffers a job's steps and writes them to the gpuwatt store from a background thread.

    ``store_url``: None takes ``GPUWATT_STORE``, else the default SQLite store (the same file
    ``gpuwatt demo``/``collect`` write). ``gpus``: this rank's GPU UUIDs (None: from
    ``CUDA_VISIBLE_DEVICES``). ``precision``: the tensor precision of the model's matmuls (tf32,
    bf16, fp16, fp8). ``store`` injects an already opened ``JobStepStore`` (then ``store_url`` is
    ignored); the reporter closes whatever store it uses.
    """

    def __init__(
        self,
        job_id: str,
        *,
        rank: int = 0,
        store_url: str | None = None,
        model_flops_per_step: float | None = None,
        tokens_per_step: float | None = None,
        gpus: Sequence[str] | None = None,
        precision: str | None = "bf16",
        host: str | None = None,
        flush_interval_s: float = 5.0,
        max_buffer: int = 10_000,
        close_timeout_s: float = 10.0,
        store: JobStepStore | None = None,
        environ: Mapping[str, str] | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        monotonic_s: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not job_id:
            raise ValueError("WorkReporter needs a job_id")
        env = os.environ if environ is None else environ
        self.job_id = str(job_id)
        self.rank = int(rank)
        self.host = host if host is not None else socket.gethostname()
        self.model_flops_per_step = model_flops_per_step
        self.tokens_per_step = tokens_per_step
        self.gpus = tuple(gpus) if gpus is not None else gpus_from_environment(env, self.host)
        self.precision = precision
        self.flush_interval_s = float(flush_interval_s)
        self.close_timeout_s = float(close_timeout_s)
        self._url = store_url if store_url is not None else env.get("GPUWATT_STORE") or None
        self._env = env
        self._store = store
        self._clock_ns = clock_ns
        self._monotonic_s = monotonic_s
        self._buffer: collections.deque[JobStep] = collections.deque()
        self._max_buffer = max(1, int(max_buffer))
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._delivered_event = threading.Condition(self._lock)
        self._next_step = 0
        self._last_mark_s = monotonic_s()
        self._recorded = self._delivered = self._dropped = self._failures = 0
        self._in_flight = 0
        self._last_error: str | None = None
        self._failing = False
        self._logged_error = False
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"gpuwatt-work-{self.job_id}-{self.rank}", daemon=True
        )
        self._thread.start()
        atexit.register(self.close)

    # --- the training loop's side (never raises, never waits on I/O) ---------------------------

    def step(
        self,
        step_time_s: float | None = None,
        *,
        step: int | None = None,
        model_flops_per_step: float | None = None,
        tokens_per_step: float | None = None,
    ) -> None:
        """Record one step that ended now. ``step_time_s`` None: the time since the previous
        ``step()`` (or since the reporter was created). ``step`` None: one more than the last."""
        try:
            now_s = self._monotonic_s()
            elapsed = now_s - self._last_mark_s
            self._last_mark_s = now_s
            self._record(
                elapsed if step_time_s is None else step_time_s,
                step,
                model_flops_per_step,
                tokens_per_step,
            )
        except Exception as exc:  # reporting must never break training
            self._note_failure(f"step() failed: {exc!r}", outage=False)

    def request(self, latency_s: float, *, tokens: float | None = None) -> None:
        """Record one served request that ended now: its latency and the tokens it produced
        (an inference server's unit of work; see the module's notes). Never raises."""
        try:
            self._last_mark_s = self._monotonic_s()
            self._record(latency_s, None, math.nan, tokens)
        except Exception as exc:  # reporting must never break serving
            self._note_failure(f"request() failed: {exc!r}", outage=False)

    @contextlib.contextmanager
    def timed_step(self, *, step: int | None = None) -> Iterator[None]:
        """Time the block as one step. An exception in the block is not recorded as a step."""
        start = self._monotonic_s()
        yield
        try:
            end = self._monotonic_s()
            self._last_mark_s = end
            self._record(end - start, step, None, None)
        except Exception as exc:
            self._note_failure(f"timed_step() failed: {exc!r}", outage=False)

    def _record(
        self,
        step_time_s: float,
        step: int | None,
        flops: float | None,
        tokens: float | None,
    ) -> None:
        st = float(step_time_s)
        if not math.isfinite(st) or st <= 0.0:
            return
        n = self._next_step if step is None else int(step)
        self._next_step = n + 1
        record = JobStep(
            time_ns=self._clock_ns(),
            job_id=self.job_id,
            rank=self.rank,
            step=n,
            step_time_s=st,
            # NaN: a served request, which has no model FLOPs (left out of the record)
            model_flops_per_step=(
                self.model_flops_per_step if flops is None else None if math.isnan(flops) else flops
            ),
            tokens_per_step=self.tokens_per_step if tokens is None else tokens,
            gpu_uuids=self.gpus,
            precision=self.precision,
            host=self.host,
        )
        with self._lock:
            if self._closed:
                self._dropped += 1
                return
            self._recorded += 1
            if len(self._buffer) >= self._max_buffer:
                self._buffer.popleft()
                self._dropped += 1
            self._buffer.append(record)

    # --- the background writer ---------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self._flush_once()
        self._flush_once()

    def _flush_once(self) -> bool:
        """Write what is buffered; True when the buffer was emptied."""
        with self._lock:
            batch = list(self._buffer)
            self._buffer.clear()
            self._in_flight = len(batch)
        if not batch:
            with self._lock:
                self._delivered_event.notify_all()
            return True
        try:
            if self._store is None:
                self._store = open_job_step_store(self._url, self._env)
            self._store.write_job_steps(batch)
        except Exception as exc:
            with self._lock:
                # put the batch back in front of what arrived meanwhile, within the bound
                self._buffer.extendleft(reversed(batch))
                over = len(self._buffer) - self._max_buffer
                for _ in range(max(over, 0)):
                    self._buffer.popleft()
                self._dropped += max(over, 0)
                self._in_flight = 0
                self._delivered_event.notify_all()
            self._note_failure(f"{type(exc).__name__}: {exc}")
            return False
        with self._lock:
            recovered, failures = self._failing, self._failures
        if recovered:  # logged before flush() can see the delivery
            log.warning(
                "gpuwatt work reporter (job %s rank %d): delivering again after %d failed writes",
                self.job_id,
                self.rank,
                failures,
            )
        with self._lock:
            self._delivered += len(batch)
            self._in_flight = 0
            self._failing = False
            self._delivered_event.notify_all()
        return True

    def _note_failure(self, message: str, *, outage: bool = True) -> None:
        """Count a failure; log it when it starts an outage (or is the first other error)."""
        with self._lock:
            self._failures += 1
            self._last_error = message
            if outage:
                first = not self._failing
                self._failing = True
            else:
                first = not self._logged_error
                self._logged_error = True
        if first and not outage:
            log.warning(
                "gpuwatt work reporter (job %s rank %d): %s (logged once)",
                self.job_id,
                self.rank,
                message,
            )
        elif first:
            log.warning(
                "gpuwatt work reporter (job %s rank %d): cannot write job steps (%s); "
                "keeping up to %d steps in memory and retrying every %g s (logged once "
                "per outage)",
                self.job_id,
                self.rank,
                message,
                self._max_buffer,
                self.flush_interval_s,
            )

    # --- control -------------------------------------------------------------------------------

    def flush(self, timeout_s: float | None = None) -> bool:
        """Ask the writer to write now and wait (at most ``timeout_s``) until the buffer is
        delivered. True when everything recorded so far has reached the store."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            while self._buffer or self._in_flight:
                if not self._thread.is_alive():
                    return False
                self._wake.set()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._delivered_event.wait(0.5 if left is None else min(left, 0.5))
            return True

    @property
    def stats(self) -> ReporterStats:
        with self._lock:
            return ReporterStats(
                recorded=self._recorded,
                delivered=self._delivered,
                dropped=self._dropped,
                failures=self._failures,
                buffered=len(self._buffer) + self._in_flight,
                last_error=self._last_error,
            )

    def close(self) -> None:
        """Deliver what is buffered (waiting at most ``close_timeout_s``), stop, close the store.

        Idempotent. Steps still undelivered at the timeout are counted as dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        self._stop.set()
        self._wake.set()
        self._thread.join(self.close_timeout_s)
        with self._lock:
            if self._thread.is_alive():  # stuck in a write: give up on it
                self._dropped += len(self._buffer) + self._in_flight
                self._buffer.clear()
                return
            self._dropped += len(self._buffer)
            self._buffer.clear()
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.close()

    def __enter__(self) -> WorkReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
