#!/usr/bin/env python3
"""Turn Sarathi-Serve's real-GPU measurements (shared/data/real_gpu) into the iteration log `tierserve calibrate
--iterations` reads.

Usage: python scripts/real_gpu_to_iterations.py [--data DIR] [--out FILE]
  then: tierserve calibrate --iterations FILE --out fit.json
(DIR defaults to shared/data/real_gpu/sarathi_serve_yi34b_a100_pcie_tp2, FILE to yi34b_a100_pcie_tp2_iterations.csv.)

What the rows are (microsoft/sarathi-serve, osdi-experiments/figure-2/operation_time_split_runs.sh):
- prefill.csv: one prompt of P tokens alone in a batch, nothing cached before it → prefill_context 0.
- decode.csv: B requests of 1,024 tokens, prefill:decode ratio 255 → 1,020 prompt tokens and 4 output tokens,
  so the three decode-only iterations per request read 1,020 / 1,021 / 1,022 cached tokens; each row is the
  mean of them (its "Batch Id" is the mean of those batches' ids) → decode_context_sum = B · 1,021.
- batch_execution_time (s) → measured_ms. inter_batch_delay (CPU gap between batches) is not part of it.
The 256-token prefill is Batch Id 0, the first batch the engine ran (no inter_batch_delay: nothing came before
it): 121 ms, more than the 512-token prefill (106 ms), i.e. warm-up. It is written with an `exclude` reason:
left out of the fit, still reported.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from tierserve.core.errors import TraceError
from tierserve.core.paths import shared_data
from tierserve.workload.readers import parse_count, parse_number

DATASET = "sarathi_serve_yi34b_a100_pcie_tp2"
MODEL, GPU, TP = "Yi-34B", "A100-80GB-PCIe", 2
PROMPT_TOKENS = 1020                  # 1,024 tokens at prefill:decode 255 → 1,020 + 4
DECODE_CONTEXT = PROMPT_TOKENS + 1    # mean cached tokens over the three decode-only steps (1,020…1,022)
HEADER = ["prefill_tokens", "decode_count", "decode_context_sum", "prefill_context", "measured_ms",
          "model", "gpu", "tp", "exclude", "source"]


def convert(data_dir: Path) -> list[list]:
    """Rows of the iteration log, prefills first, in the order of the CSVs. Counts written as integral floats
    (`512.0`) are integers; a non-integral one is a TraceError naming file, row and field."""
    out: list[list] = []
    src = str(data_dir / "prefill.csv")
    with (data_dir / "prefill.csv").open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=1):
            p = parse_count(src, i, "batch_num_prefill_tokens", r["batch_num_prefill_tokens"], 1)
            first = parse_number(src, i, "Batch Id", r["Batch Id"]) == 0.0 and not r["inter_batch_delay"].strip()
            reason = ("first batch of the run (Batch Id 0, no inter_batch_delay): warm-up, slower than the "
                      "512-token prefill") if first else ""
            ms = parse_number(src, i, "batch_execution_time", r["batch_execution_time"]) * 1e3
            out.append([p, 0, 0, 0, ms, MODEL, GPU, TP, reason, f"prefill.csv row {r['']}"])
    src = str(data_dir / "decode.csv")
    with (data_dir / "decode.csv").open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=1):
            b = parse_count(src, i, "batch_size", r["batch_size"], 1)
            ms = parse_number(src, i, "batch_execution_time", r["batch_execution_time"]) * 1e3
            out.append([0, b, b * DECODE_CONTEXT, 0, ms, MODEL, GPU, TP, "", f"decode.csv row {r['']}"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=Path("yi34b_a100_pcie_tp2_iterations.csv"))
    args = ap.parse_args(argv)
    data = args.data or shared_data("real_gpu", DATASET)
    if data is None or not (data / "prefill.csv").is_file():
        print(f"real_gpu/{DATASET} not found (set TIERSERVE_SHARED or pass --data)", file=sys.stderr)
        return 2
    try:
        rows = convert(Path(data))
    except TraceError as e:
        print(e, file=sys.stderr)
        return 2
    with args.out.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(rows)
    excluded = sum(1 for r in rows if r[8])
    print(f"wrote {args.out}: {len(rows)} iterations ({excluded} excluded from the fit, with the reason)")
    print(f"next: tierserve calibrate --iterations {args.out} --out fit.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
