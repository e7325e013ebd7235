"""What the engine writes while it runs: the iteration log (for `tierserve calibrate --iterations`) and the
decision log (what the policy decided each step and what the engine ran)."""
from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass
from pathlib import Path

# `calibrate_from_iterations` reads the first five (prefill_attn_pairs = Σ chunk·(context + chunk/2) over the
# step's prefill chunks); step, num_requests and preemptions are for people; a non-empty exclude keeps a row
# out of the fit but in its report.
ITERATION_HEADER = ("prefill_tokens", "prefill_attn_pairs", "decode_count", "decode_context_sum", "measured_ms",
                    "step", "num_requests", "preemptions", "exclude")
WARMUP_STEPS = 2          # the engine's first batches pay one-time costs (lazy allocation, first kernels)
FLUSH_EVERY_S = 1.0


@dataclass(slots=True)
class StepShape:
    """One engine step as the execution-time model sees it (the simulator's `Replica` computes the same)."""

    prefill_tokens: int = 0
    prefill_attn_pairs: float = 0.0
    decode_count: int = 0
    decode_context_sum: int = 0
    num_requests: int = 0
    preemptions: int = 0

    def add(self, num_tokens: int, computed_before: int, is_decode: bool) -> None:
        self.num_requests += 1
        if is_decode:
            self.decode_count += 1
            self.decode_context_sum += computed_before + 1
        else:
            self.prefill_tokens += num_tokens
            self.prefill_attn_pairs += num_tokens * (computed_before + num_tokens * 0.5)


class _Appender:
    """A file written row by row, flushed at most once a second and on close (cheap on the step path)."""

    def __init__(self, path: str | Path, line_buffered: bool = False) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        self.file = p.open("w", newline="", buffering=1 if line_buffered else -1)
        self._flushed = time.monotonic()

    def _maybe_flush(self) -> None:
        now = time.monotonic()
        if now - self._flushed >= FLUSH_EVERY_S:
            self.file.flush()
            self._flushed = now

    def close(self) -> None:
        if not self.file.closed:
            self.file.close()


class IterationLog(_Appender):
    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self.writer = csv.writer(self.file)
        self.writer.writerow(ITERATION_HEADER)
        self.rows = 0

    def write(self, step: int, shape: StepShape, measured_s: float) -> None:
        self.rows += 1
        exclude = "warm-up: one of the engine's first batches" if self.rows <= WARMUP_STEPS else ""
        self.writer.writerow((shape.prefill_tokens, round(shape.prefill_attn_pairs, 1), shape.decode_count,
                              shape.decode_context_sum, round(measured_s * 1e3, 4), step, shape.num_requests,
                              shape.preemptions, exclude))
        self._maybe_flush()


class DecisionLog(_Appender):
    """One JSON object per engine step: `plan` (request id, tokens) as the policy decided it, `preempt`,
    `relegate` and `admit` (ids), the `budget` set, and `engine` — what vLLM then scheduled — with `agree`;
    and one `{"finished": id}` per request leaving the engine. Written line by line (readable while the
    engine runs in another process): a debugging and testing aid, off by default."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, line_buffered=True)

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record, separators=(",", ":")) + "\n")


class RequestLog(DecisionLog):
    """One JSON object per request leaving the engine (`EngineSettings.request_log`)."""


def read_decisions(path: str | Path) -> list[dict]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
