"""sim_to_real's real side: one vLLM OpenAI server with tierserve's scheduler — started, pinned, driven with
streamed completions, and every phase (warm-up, probes, capacity, calibration and validation runs) collected."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tierserve.engines.vllm.run import prompt_ids
from tierserve.experiments.sim_to_real.records import iteration_rows
from tierserve.experiments.sim_to_real.step_model import fit_mean_step_time, fit_of, write_fit
from tierserve.experiments.sim_to_real.workload import (BLOCK_SIZE, CAPACITY_BURST, FRONTEND_PROBES, MAX_MODEL_LEN,
                                                        MAX_NUM_SEQS, NUM_BLOCKS, ROOT, TIER_SLOS, TOKEN_BUDGET,
                                                        make_trace)


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


def settle(out: Path, n_requests_before: int, expected: int) -> None:
    """Wait until the engine has logged every request of the run (its logs flush when it goes idle)."""
    deadline = time.time() + 10
    while time.time() < deadline:
        with (out / "requests.jsonl").open() as f:
            if sum(1 for line in f if line.strip()) >= n_requests_before + expected:
                break
        time.sleep(0.1)
    time.sleep(1.2)            # the iteration log flushes at most once a second and when idle


def run_load(port: int, out: Path, label: str, rate: float, n: int, seed: int, logged: list[int]
             ) -> tuple[list[dict], list[dict], list[dict], float]:
    """Drive one Poisson trace; (trace, client records, its iteration-log rows, wall s)."""
    before = len(iteration_rows(out))
    trace = make_trace(n, rate, seed)
    real, wall = drive(port, trace, label)
    settle(out, logged[0], n)
    logged[0] += n
    return trace, real, iteration_rows(out)[before:], wall


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
