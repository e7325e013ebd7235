"""What the engine writes while it runs: the iteration log (for `tierserve calibrate --iterations`) and the
decision log (what the policy decided each step and what the engine ran)."""
from __future__ import annotations

import csv
import json
import time
from pathlib import Path

# `calibrate_from_iterations` reads the first five (prefill_attn_pairs = Σ chunk·(context + chunk/2) over the
# step's prefill chunks); step, num_requests and preemptions are for people; a non-empty exclude keeps a row
# out of the fit but in its report.
ITERATION_HEADER = ("prefill_tokens", "prefill_attn_pairs", "decode_count", "decode_context_sum", "measured_ms",
                    "step", "num_requests", "preemptions", "exclude")
WARMUP_STEPS = 2          # the engine's first batches pay one-time costs (lazy allocation, first kernels)
FLUSH_EVERY_S = 1.0


class _Appender:
    """A file written on the engine's thread, opened for `IterationLog`'s batched rows or line by line. Written
    in place (it is read while the engine runs), through the output layer's checks: a target that is not a
    regular file (a FIFO would block the engine's start; a device node) is refused naming the setting, and an
    unwritable one is one line naming the path."""

    field = "log"           # the EngineSettings field that names the file

    def __init__(self, path: str | Path, line_buffered: bool = False) -> None:
        from tierserve.core.outputs import check_out_file, output_error
        p = check_out_file(path, f"tierserve.{self.field}")
        try:
            self.file = p.open("w", newline="", buffering=1 if line_buffered else -1)
        except OSError as e:
            raise output_error(e, p) from None

    def close(self) -> None:
        if not self.file.closed:
            self.file.close()


class IterationLog(_Appender):
    """One CSV row per engine step (`ITERATION_HEADER`). A step only appends its numbers; rows are formatted
    and written when the log is flushed (at most once a second, when the engine goes idle, on close), so the
    step path never formats."""

    field = "iteration_log"

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self.writer = csv.writer(self.file)
        self.writer.writerow(ITERATION_HEADER)
        self.rows = 0
        self._unwritten: list[tuple] = []
        self._flushed = time.monotonic()

    def add(self, step: int, shape: tuple, measured_s: float) -> None:
        """One step: `shape` is (prefill_tokens, prefill_attn_pairs, decode_count, decode_context_sum,
        num_requests, preemptions), what `PolicyDriver.record_schedule` counted."""
        self.rows += 1
        self._unwritten.append((step, shape, measured_s))
        if time.monotonic() - self._flushed >= FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        rows = self._unwritten
        if rows:
            first = self.rows - len(rows) + 1           # 1-based number of the first unwritten row
            self.writer.writerows(
                (pt, round(pairs, 1), dc, dcs, round(measured_s * 1e3, 4), step, nreq, pre,
                 "warm-up: one of the engine's first batches" if first + i <= WARMUP_STEPS else "")
                for i, (step, (pt, pairs, dc, dcs, nreq, pre), measured_s) in enumerate(rows))
            rows.clear()
        self.file.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        if not self.file.closed:
            self.flush()
        super().close()


class DecisionLog(_Appender):
    """One JSON object per engine step: `plan` (request id, tokens) as the policy decided it, `preempt`,
    `relegate` and `admit` (ids), the `budget` set, and `engine` — what vLLM then scheduled — with `agree`;
    and one `{"finished": id}` per request leaving the engine. Written line by line (readable while the
    engine runs in another process): a debugging and testing aid, off by default."""

    field = "decision_log"

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, line_buffered=True)

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record, separators=(",", ":")) + "\n")


class RequestLog(DecisionLog):
    """One JSON object per request leaving the engine (`EngineSettings.request_log`)."""

    field = "request_log"


def read_decisions(path: str | Path) -> list[dict]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
