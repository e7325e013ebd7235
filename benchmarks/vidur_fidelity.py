"""Fidelity against Vidur: replay Vidur's reference runs (same requests) and print both side by side.

Scenario (../shared/data/vidur/reference_runs/README.md): Llama-3-8B, A100-80GB, TP1, one replica,
Poisson 4 req/s, splitwise_conv lengths; Vidur `vllm` (→ tierserve `vllm_v0`, token budget 4096) and
`sarathi` (chunk 512), batch cap 128, KV block 16, watermark 1%, memory margin 10%. The execution-time
model runs in the `vidur_parity` mode (Vidur's KV-write model, no LM head, no CPU overhead), as Vidur does.

    python benchmarks/vidur_fidelity.py [--runs n1000,n10000] [--tolerance 0.10] [--tbt-tolerance 0.15]
    python benchmarks/vidur_fidelity.py --vidur-run sarathi=DIR [--vidur-run vllm=DIR ...]

`--vidur-run SCHEDULER=DIR` compares against any Vidur run folder of the same model/GPU/settings instead (a
trace replay, an overload run): DIR holds its request_metrics.csv, request_arrival_time_series.csv and
decode_token_execution_plus_preemption_time.csv. Every file is read through tierserve's trace-cell parsers:
Vidur writes token counts as `44.0` in trace replays, which are integers; `44.5` is an error naming file,
row and field.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from tierserve.core.errors import InputError
from tierserve.core.paths import shared_data
from tierserve.metrics import RequestTable
from tierserve.experiments.scenario import token_tbt
from tierserve.sim import ClusterConfig, simulate
from tierserve.workload import read_vidur_run
from tierserve.workload.readers import parse_count, parse_number

POLICY = {"vllm": ("vllm_v0", 4096), "sarathi": ("sarathi", 512)}
METRICS = [("TTFT p50", "ttft", 50), ("TTFT p90", "ttft", 90), ("E2E p50", "e2e", 50), ("E2E p90", "e2e", 90),
           ("TBT p50", "tbt", 50)]
# Known modelling differences, printed with the table so a gap is read for what it is.
NOTES = [
    "Decode iterations: with the refreshed reference runs (clean predictor cache) Vidur's decode iterations agree "
    "with its own predictor table, and so with tierserve (p10/p50/p90 printed above per run); the 16-23% E2E/TBT "
    "gap measured against the earlier runs came from Vidur's stale decode-attention cache, not from either model.",
    "Sarathi TTFT: +1.7/+6.3% (P50/P90, n1000) and +1.7/+6.0% (n10000) against Vidur since vidur_parity adopted "
    "Vidur's KV-write model (KV-cache write note below); before, +13-15%, because 75% of Sarathi's prefill-carrying batches hold "
    "exactly 512 tokens, where tierserve charged the prefill rows' write (4.6 ms) and Vidur charges 1.7 ms. The "
    "scheduling rules match Vidur's sarathi (decodes, then partial prefills, then new prefills FCFS in one 512-token "
    "budget; whole-prompt blocks at admission above the watermark). What remains (mostly P90) is prompts >= 2,048 "
    "tokens, whose prefill still takes ~1.06x Vidur's time: Vidur's partial attention profile has no 512-token "
    "chunks with a KV prefix, so its prefill-attention estimate barely grows with the prefix, while tierserve's "
    "causal-pair term does. Not copied: it is a gap in Vidur's training data, not a modelling choice.",
    "Vidur predicts decode attention from the batch's mean context (f(batch, avg kv)); tierserve sums each "
    "decode's context (sum, not mean), which matters for mixed-length batches.",
    "KV-cache write (modelling choice): Vidur predicts it with one random forest whose only input is num_tokens = "
    "max(prefill_chunk_size, batch_size), trained on decode rows (~0.004 ms/layer at every batch size up to 512) "
    "and prefill rows (0.152 ms/layer at 512; multiples of 32 only) pooled, and queried with the batch's total "
    "tokens (prefill + decodes, unrounded). Up to 512 tokens it predicts the mean of both kinds of row at that "
    "count (1.74 ms at 512 where the prefill rows alone give 4.9 ms; ~0.1 ms at counts without a prefill row, such "
    "as 500); past 512 only prefill rows exist (15.9 ms at 1024). vidur_parity does the same: the mean "
    "attn_kv_cache_save over all profile rows per token count, looked up at the nearest profiled count of P + B "
    "(piecewise constant, as the forest is; linear past the last count), and no KV write in the prefill or "
    "per-decode terms, nor the decode write's fixed part (0.075 ms per iteration, which the pooled decode rows "
    "already hold). Physical mode keeps an HBM-bound write.",
    "Vidur's attention model here was trained on an 876-row partial extract of the real profile.",
    "Vidur's TBT is 'decode token execution plus preemption time' per token; tierserve's is the token-level "
    "gap between consecutive tokens of a request (the same quantity when nothing else intervenes).",
]


def _rows(path) -> list[tuple[int, dict[str, str]]]:
    """(1-based data row, cells) of one of Vidur's CSV outputs."""
    with open(path, newline="") as f:
        return list(enumerate(csv.DictReader(f), start=1))


def vidur_numbers(run_dir) -> dict[str, float]:
    path = str(run_dir / "request_metrics.csv")
    rows = _rows(path)
    out = {"ttft": np.array([parse_number(path, i, "prefill_e2e_time", r["prefill_e2e_time"]) for i, r in rows]),
           "e2e": np.array([parse_number(path, i, "request_e2e_time", r["request_e2e_time"]) for i, r in rows])}
    path = str(run_dir / "decode_token_execution_plus_preemption_time.csv")
    field = "decode_token_execution_plus_preemption_time"
    out["tbt_cdf"] = [(parse_number(path, i, "cdf", r["cdf"]), parse_number(path, i, field, r[field]))
                      for i, r in _rows(path)]
    return out


def per_decode_ms(run_dir, end: str, start: str) -> np.ndarray:
    """Per request of more than 20 decodes, 1000·(end − start) / (decodes − 1) from Vidur's request_metrics."""
    path = str(run_dir / "request_metrics.csv")
    per = []
    for i, row in _rows(path):
        n = parse_count(path, i, "request_num_decode_tokens", row["request_num_decode_tokens"])
        if n > 20:
            per.append(1000 * (parse_number(path, i, end, row[end]) - parse_number(path, i, start, row[start])) / (n - 1))
    return np.array(per)


def vidur_decode_iteration_ms(run_dir) -> np.ndarray:
    """Vidur's own per-request mean decode-iteration time: (execution − prefill execution) / (decodes − 1)."""
    return per_decode_ms(run_dir, "request_execution_time", "prefill_time_execution_plus_preemption")


def pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q))


def cdf_quantile(cdf: list[tuple[float, float]], q: float) -> float:
    ps, vs = zip(*cdf)
    return float(np.interp(q / 100.0, ps, vs))


def reference_run(scheduler: str, n: str):
    run_dir = shared_data("vidur", "reference_runs", f"l3_{scheduler}_poisson_qps4_{n}")
    if run_dir is None:
        raise SystemExit("../shared/data/vidur/reference_runs is absent: nothing to compare against")
    return run_dir


def run(scheduler: str, run_dir, tolerance: float, tbt_tolerance: float) -> list[tuple[str, float, float, float, bool]]:
    requests = read_vidur_run(run_dir)
    local, budget = POLICY[scheduler]
    cfg = ClusterConfig(num_replicas=1, local_policy=local, cluster_policy="round_robin",
                        replica={"model": "Llama-3-8B", "gpu": "A100-80GB", "tp": 1, "exec_mode": "vidur_parity",
                                 "token_budget": budget,
                                 "max_num_seqs": 128, "watermark_fraction": 0.01, "gpu_memory_utilization": 0.9})
    res = simulate(cfg, requests)
    table = RequestTable.from_states(res.states, res.reasons)
    ours = {"ttft": table.ttft_s, "e2e": table.ttlt_s}
    tbt = token_tbt(res)
    vidur = vidur_numbers(run_dir)
    rows = []
    for label, key, q in METRICS:
        v = cdf_quantile(vidur["tbt_cdf"], q) if key == "tbt" else pct(vidur[key], q)
        t = tbt.quantile(q / 100.0) if key == "tbt" else pct(ours[key][~np.isnan(ours[key])], q)
        err = (t - v) / v
        rows.append((label, v, t, err, abs(err) <= (tbt_tolerance if key == "tbt" else tolerance)))
    values, counts = res.tbt_by_tier[0].items()
    values, counts = np.array(values), np.array(counts)
    fast = values < 0.05                     # gaps not stretched by a prefill batch: one decode iteration
    ours_iter = np.repeat(values[fast], counts[fast]) * 1000
    print(f"decode iteration ms p10/p50/p90 — Vidur (its request_metrics): "
          f"{np.percentile(vidur_decode_iteration_ms(run_dir), [10, 50, 90]).round(1).tolist()}; "
          f"tierserve (token gaps < 50 ms): {np.percentile(ours_iter, [10, 50, 90]).round(1).tolist()}")
    # like for like: both sides' per-request (E2E − TTFT) / (decodes − 1), mixed iterations included
    n_out = table["output_tokens"].astype(float)
    long = (n_out > 20) & ~np.isnan(table.ttlt_s)
    ours_dec = 1000 * (table.ttlt_s[long] - table.ttft_s[long]) / (n_out[long] - 1)
    vid_dec = per_decode_ms(run_dir, "request_e2e_time", "prefill_e2e_time")
    print(f"per-request (E2E − TTFT)/(decodes − 1) ms p10/p50/p90 — Vidur: "
          f"{np.percentile(vid_dec, [10, 50, 90]).round(1).tolist()}; tierserve: "
          f"{np.percentile(ours_dec, [10, 50, 90]).round(1).tolist()}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="n1000,n10000")
    ap.add_argument("--tolerance", type=float, default=0.10, help="TTFT and E2E percentiles")
    ap.add_argument("--tbt-tolerance", type=float, default=0.15, help="TBT P50")
    ap.add_argument("--vidur-run", action="append", default=[], metavar="SCHEDULER=DIR",
                    help=f"a Vidur run folder to compare against instead of the reference runs ({' | '.join(POLICY)})")
    args = ap.parse_args(argv)
    if args.vidur_run:
        todo = []
        for spec in args.vidur_run:
            scheduler, _, folder = spec.partition("=")
            if scheduler not in POLICY or not folder:
                ap.error(f"--vidur-run {spec!r}: expected SCHEDULER=DIR with SCHEDULER one of {', '.join(POLICY)}")
            todo.append((scheduler, Path(folder), folder))
    else:
        todo = [(scheduler, reference_run(scheduler, n), f"{n} requests")
                for scheduler in POLICY for n in args.runs.split(",")]
    failed = 0
    try:
        for scheduler, run_dir, label in todo:
            failed += compare(scheduler, run_dir, label, args.tolerance, args.tbt_tolerance)
    except InputError as e:          # a malformed Vidur file: its name, row and field, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\nWhere they differ, known reasons:")
    for note in NOTES:
        print(" - " + note)
    print(f"\n{failed} metric(s) outside tolerance")
    return 1 if failed else 0


def compare(scheduler: str, run_dir, label: str, tolerance: float, tbt_tolerance: float) -> int:
    """Print one run's side-by-side table; the number of metrics outside tolerance."""
    failed = 0
    print(f"\nVidur {scheduler} vs tierserve {POLICY[scheduler][0]} — {label}")
    print(f"{'metric':<10} {'Vidur s':>10} {'tierserve s':>12} {'error':>8}  within ±{tolerance:.0%} "
          f"(TBT ±{tbt_tolerance:.0%})")
    for metric, v, t, err, ok in run(scheduler, run_dir, tolerance, tbt_tolerance):
        failed += not ok
        print(f"{metric:<10} {v:>10.4f} {t:>12.4f} {err:>+8.1%}  {'yes' if ok else 'NO'}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
