#!/usr/bin/env python3
"""Compare tierserve's calibrated execution-time model with Vidur's own predictions (Llama-3-8B, A100, TP1).

Like for like: Vidur's predicted_ms covers all layers and excludes the LM head, sampling and CPU overheads,
and uses its profiled KV-cache write, so the model is built in the `vidur_parity` mode (no LM head, no
overhead, Vidur's KV-write model: profile rows pooled by token count, looked up at the batch's total tokens).
Also prints held-out fit errors.

    python benchmarks/validate_exec_model.py [--table CSV]

`--table` checks another Vidur predictor table of the same columns (model, device and tp are read from its
rows, e.g. a Llama-2-70B TP2 table); every cell goes through tierserve's trace-cell parsers, so a count
written `128.0` is an integer and `128.5` an error naming file, row and column.
"""
from __future__ import annotations

import argparse
import csv
import sys

from tierserve.core.errors import InputError
from tierserve.core.paths import shared_data
from tierserve.hardware.calibration import format_fit_summary
from tierserve.hardware.coefficients import load_store
from tierserve.hardware.exec_model import make_execution_model, prefill_attention_pairs
from tierserve.workload.readers import parse_count, parse_number

TARGET_MAPE_PCT = 5.0
EXPLAIN_ABOVE_PCT = 15.0


def compare(path=None) -> list[dict]:
    """One dict per Vidur row: shape, vidur_ms, ours_ms, err_pct, plus Vidur's breakdown columns."""
    if path is None:
        path = shared_data("vidur", "vidur_predictions_llama3_8b_a100.csv")
        if path is None:
            raise FileNotFoundError("shared/data/vidur/vidur_predictions_llama3_8b_a100.csv not found")
    src = str(path)
    models: dict[tuple[str, str, int], object] = {}
    out = []
    with open(path, newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=1):
            def count(name: str) -> int:
                return parse_count(src, i, name, r[name])

            def number(name: str) -> float:
                return parse_number(src, i, name, r[name])
            key = (r["model"], r["device"], count("tp"))
            if key not in models:
                models[key] = make_execution_model(*key, mode="vidur_parity")
            p, b = count("num_prefill_tokens"), count("num_decode")
            ctx, kvb = count("decode_context"), count("prefill_kv_before")
            ours = models[key].iteration_time(p, prefill_attention_pairs(p, kvb) if p else 0.0, b, b * ctx) * 1e3
            vid = number("predicted_ms")
            out.append({"shape": r["batch_description"], "vidur_ms": vid, "ours_ms": ours,
                        "err_pct": (ours - vid) / vid * 100.0, "kv_save_ms": number("attn_kv_cache_save_ms"),
                        "notes": r["notes"], "p": p, "b": b})
    return out


def profile_agreement() -> list[tuple[str, int, float, float, float]]:
    """(model/GPU, TP, profiled counts, worst |fit/profile − 1| of the linear layers (GEMMs + elementwise) over
    every profiled token count, the error at 128 tokens) for each committed profile fit whose mlp.csv is here."""
    import numpy as np

    from tierserve.hardware.roofline import ELEMENTWISE_OPS, GEMM_OPS
    from tierserve.hardware.specs import get_gpu, get_model
    out = []
    store = load_store()
    for gname, by_model in sorted(store.layers.items()):
        g = get_gpu(gname)
        for mname, fits in sorted(by_model.items()):
            m = get_model(mname)
            d = shared_data("vidur", "profiling", "compute", g.profile_dir or "", *(m.profile_dir or "").split("/"))
            if d is None or not (d / "mlp.csv").is_file():
                continue
            with open(d / "mlp.csv", newline="") as f:
                rows = list(csv.DictReader(f))
            for tp, lf in sorted(fits.items()):
                sel = [r for r in rows if int(float(r["num_tensor_parallel_workers"])) == tp]
                t = np.array([float(r["num_tokens"]) for r in sel])
                prof = sum(np.array([float(r[f"time_stats.{o}.median"]) for r in sel]) for o in GEMM_OPS + ELEMENTWISE_OPS)
                fit = (sum(lf.gemm[o].ms(m, g, tp, o, t) for o in GEMM_OPS)
                       + sum(lf.elementwise[o].ms(t) for o in ELEMENTWISE_OPS))
                err = fit / prof - 1
                at128 = float(err[t == 128][0]) if (t == 128).any() else float("nan")
                out.append((f"{mname}/{gname}", tp, len(set(t.tolist())), float(np.abs(err).max()), at128))
    return out


def print_profile_agreement() -> None:
    rows = profile_agreement()
    if not rows:
        return
    print("\nlinear layers (GEMMs + elementwise) of the committed fit against their Vidur profile, every profiled count:")
    print(f"  {'model/GPU':28s} {'TP':>3s} {'counts':>6s} {'worst %':>8s} {'at 128 %':>9s}")
    for name, tp, n, worst, at128 in rows:
        print(f"  {name:28s} {tp:3d} {n:6d} {worst * 100:8.2f} {at128 * 100:+9.2f}")


def explain(row: dict) -> str:
    """Why a shape differs by more than EXPLAIN_ABOVE_PCT."""
    if row["p"] and row["kv_save_ms"] > 0.01 * row["p"]:
        return (f"Vidur's KV write is {row['kv_save_ms']:.1f} ms here; tierserve follows the same pooled curve "
                "(nearest profiled count of the batch's total tokens), where Vidur's forest may average "
                "neighbouring counts differently. Vidur row note: " + row["notes"])
    return "Vidur row note: " + row["notes"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default=None, help="a Vidur predictor table (default: the Llama-3-8B A100 one)")
    args = ap.parse_args(argv)
    try:
        rows = compare(args.table)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{'shape':46s} {'Vidur ms':>9s} {'tierserve ms':>12s} {'error %':>8s}")
    for r in rows:
        print(f"{r['shape']:46s} {r['vidur_ms']:9.2f} {r['ours_ms']:12.2f} {r['err_pct']:+8.2f}")
    mape = sum(abs(r["err_pct"]) for r in rows) / len(rows)
    print(f"\nMAPE over {len(rows)} shapes: {mape:.2f}% (target ≤ {TARGET_MAPE_PCT}%)")
    big = [r for r in rows if abs(r["err_pct"]) > EXPLAIN_ABOVE_PCT]
    print(f"shapes off by more than {EXPLAIN_ABOVE_PCT}%: {len(big)}")
    for r in big:
        print(f"  - {r['shape']}: {r['err_pct']:+.1f}% — {explain(r)}")
    mid = [r for r in rows if 5.0 < abs(r["err_pct"]) <= EXPLAIN_ABOVE_PCT]
    if mid:
        print("notes on shapes off by 5-15% (Vidur's own caveat for the row, then ours):")
        for r in mid:
            ours = ("decode at tiny batch: Vidur's random forest averages neighbouring token counts; we follow "
                    "the profiled 1-token medians" if r["b"] <= 8 and not r["p"] else
                    "KV-write/attention terms where Vidur's partial-extract predictions are flagged")
            print(f"  - {r['shape']}: {r['err_pct']:+.1f}% — {r['notes']}; {ours}")
    print_profile_agreement()
    store = load_store()
    summ = store.meta.get("fit_error_pct", {})
    if summ:
        print("\n" + format_fit_summary(summ))
    return 0 if mape <= TARGET_MAPE_PCT else 1


if __name__ == "__main__":
    sys.exit(main())
