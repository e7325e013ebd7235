"""Simulator speed and memory: simulated requests per wall-second and peak RSS, side by side with Vidur.

    python benchmarks/sim_speed.py [--sizes 10000,50000] [--scaling] [--big]

Scenario: Vidur's reference (Llama-3-8B, A100, TP1, 1 replica, Poisson 4 req/s, splitwise_conv lengths
clipped to 4,096 tokens, `vllm_v0`, token budget 4096, batch cap 128). Each size runs in a fresh process
so its peak RSS is its own. With `VIDUR_PYTHON=/path/to/vidur/python` (a Python whose environment has
Vidur installed, run from Vidur's checkout given by `VIDUR_DIR`), Vidur runs the same scenario in the same
benchmark and the ratios are measured; without it, Vidur's recorded figures on this machine class
(../shared/data/vidur/reference_runs) are printed for reference and labelled as such.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

# Vidur's recorded figures on a 2-core machine (reference_runs/summary.csv `sim_req_per_wall_s`, i.e. its
# event loop alone, and README.md for 50k): simulated req/s, peak RSS MB. Conservative: excludes its init.
VIDUR_RECORDED = {
    10000: (549.5, 790.5),
    50000: (540.0, 2150.0),
}


def one_run(n: int, replicas: int, policy: str) -> dict:
    from tierserve.sim import ClusterConfig, simulate
    from tierserve.workload import WorkloadConfig, build_requests
    wl = WorkloadConfig.from_dict({
        "num_requests": n, "seed": 42, "arrivals": {"kind": "poisson", "rate": 4.0 * replicas},
        "lengths": {"kind": "empirical", "dataset": "azure2023_conv", "max_total_tokens": 4096},
        "tiers": {"num_tiers": 1, "mix": "uniform"}})
    requests = build_requests(wl)
    cfg = ClusterConfig(num_replicas=replicas, local_policy=policy,
                        cluster_policy="round_robin",
                        replica={"token_budget": 4096, "max_num_seqs": 128, "watermark_fraction": 0.01})
    t0 = time.perf_counter()
    res = simulate(cfg, requests)
    wall = time.perf_counter() - t0
    return {"n": n, "replicas": replicas, "policy": policy, "wall_s": wall, "req_per_s": n / wall,
            "iterations": res.stats["iterations"], "events": res.stats["events"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def in_subprocess(n: int, replicas: int, policy: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", f"{n},{replicas},{policy}"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def vidur_live(n: int) -> tuple[float, float] | None:
    py, vdir = os.environ.get("VIDUR_PYTHON"), os.environ.get("VIDUR_DIR")
    if not py or not vdir:
        return None
    cmd = [py, "-m", "vidur.main", "--replica_config_model_name", "meta-llama/Meta-Llama-3-8B",
           "--request_generator_config_type", "synthetic", "--synthetic_request_generator_config_num_requests",
           str(n), "--interval_generator_config_type", "poisson", "--poisson_request_interval_generator_config_qps",
           "4", "--length_generator_config_type", "trace",
           "--trace_request_length_generator_config_trace_file", "./data/processed_traces/splitwise_conv.csv",
           "--replica_scheduler_config_type", "vllm", "--vllm_scheduler_config_batch_size_cap", "128"]
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], cwd=vdir, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    rss_kb = float(proc.stderr.strip().splitlines()[-1]) if proc.returncode == 0 else float("nan")
    return wall, rss_kb / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,50000")
    ap.add_argument("--scaling", action="store_true", help="also time vs requests and vs replicas")
    ap.add_argument("--big", action="store_true", help="also the 16-replica, 100k-request run")
    ap.add_argument("--child")
    args = ap.parse_args(argv)
    if args.child:
        n, reps, pol = args.child.split(",")
        print(json.dumps(one_run(int(n), int(reps), pol)))
        return 0
    print(f"{'requests':>9} {'tierserve req/s':>16} {'peak MB':>8} {'Vidur req/s':>12} {'Vidur MB':>9} "
          f"{'speed ratio':>12} {'memory ratio':>13}  Vidur source")
    for n in [int(s) for s in args.sizes.split(",")]:
        ours = in_subprocess(n, 1, "vllm_v0")
        live = vidur_live(n)
        if live:
            v_rps, v_mb = n / live[0], live[1]
        else:
            v_rps, v_mb = VIDUR_RECORDED.get(n, (float("nan"), float("nan")))
        print(f"{n:>9} {ours['req_per_s']:>16,.0f} {ours['peak_rss_mb']:>8.0f} {v_rps:>12,.0f} {v_mb:>9.0f} "
              f"{ours['req_per_s'] / v_rps:>11.1f}x {ours['peak_rss_mb'] / v_mb:>12.2f}x  "
              f"{'measured now' if live else 'recorded (reference_runs)'}")
    if args.scaling:
        print("\ntime vs requests (1 replica) and vs replicas (load 4 req/s per replica, 5k requests per replica):")
        for n in (2500, 5000, 10000, 20000):
            r = in_subprocess(n, 1, "vllm_v0")
            print(f"  1 replica  {n:>7} requests: {r['wall_s']:6.2f} s  {r['req_per_s']:>9,.0f} req/s")
        for reps in (1, 2, 4, 8, 16):
            r = in_subprocess(5000 * reps, reps, "vllm_v0")
            print(f"  {reps:>2} replicas {5000 * reps:>7} requests: {r['wall_s']:6.2f} s  {r['req_per_s']:>9,.0f} req/s")
    if args.big:
        r = in_subprocess(100000, 16, "vllm_v0")
        print(f"\n16 replicas, 100k requests: {r['wall_s']:.1f} s wall, {r['req_per_s']:,.0f} req/s, "
              f"peak {r['peak_rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
