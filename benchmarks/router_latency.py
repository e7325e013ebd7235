#!/usr/bin/env python3
"""The router's added latency per request: the same requests sent to an engine directly and through
`tierserve router` (its own process), interleaved one by one, P50/P99 of each and of the difference.

    python benchmarks/router_latency.py [--requests 300] [--engine-url http://127.0.0.1:8001 --model NAME]

Without --engine-url it starts the stand-in engine (tierserve.router.fake_engine, answers at once) so what is
measured is the router alone: parsing, tier resolution, the policy's dispatch, the forward and the response
rewrite. Loopback only; every process it starts is stopped at the end. Timing is wall clock on a shared machine:
read the P50s, and the P99s as what a busy 2-core box does to both paths alike.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, path: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url}{path} not ready after {timeout_s:g} s")


def spawn(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def measure(engine: str, router: str, model: str, n: int, stream: bool) -> tuple[np.ndarray, np.ndarray]:
    body = {"model": model, "prompt": "t1 t2 t3 t4", "max_tokens": 4, "stream": stream}
    direct, routed = [], []
    with httpx.Client(timeout=30) as c:
        def once(base: str) -> float:
            t0 = time.perf_counter()
            if stream:
                with c.stream("POST", f"{base}/v1/completions", json=body) as s:
                    for _ in s.iter_bytes():
                        pass
                    assert s.status_code == 200, s.status_code
            else:
                r = c.post(f"{base}/v1/completions", json=body)
                assert r.status_code == 200, r.text[:300]
            return time.perf_counter() - t0
        for _ in range(20):                     # warm both paths (connections, first-call imports)
            once(engine), once(router)
        for i in range(n):                      # interleaved, alternating which goes first
            if i % 2:
                direct.append(once(engine))
                routed.append(once(router))
            else:
                routed.append(once(router))
                direct.append(once(engine))
    return np.array(direct) * 1e3, np.array(routed) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--engine-url", default=None, help="A running vLLM server (default: start the stand-in)")
    ap.add_argument("--model", default="fake-model")
    ap.add_argument("--policy", default="jsq")
    a = ap.parse_args()
    if not 1 <= a.requests <= 100_000:
        raise SystemExit(f"--requests: got {a.requests}; allowed: 1..100000")
    procs = []
    try:
        if a.engine_url is None:
            port = free_port()
            procs.append(spawn(["-m", "tierserve.router.fake_engine", "--port", str(port), "--token-delay-s", "0"]))
            engine = f"http://127.0.0.1:{port}"
            wait_ready(engine, procs[-1], "/health")
        else:
            engine = a.engine_url.rstrip("/")
        rport = free_port()
        cfg = Path(tempfile.mkdtemp(prefix="router-bench-")) / "router.yaml"
        cfg.write_text(f"engines: [{{url: '{engine}'}}]\nport: {rport}\ncluster_policy: {a.policy}\n"
                       "tiers: [{name: gold}, {name: silver}]\nlog_requests: false\n")
        procs.append(spawn(["-m", "tierserve", "router", "--config", str(cfg), "--log-level", "warning"]))
        router = f"http://127.0.0.1:{rport}"
        wait_ready(router, procs[-1], "/ready")
        print(f"engine {engine} ({'stand-in' if a.engine_url is None else 'given'}), router {router} "
              f"(policy {a.policy}), {a.requests} requests per path, one at a time, interleaved\n")
        print(f"{'request':<12} {'direct P50':>11} {'router P50':>11} {'added P50':>10} "
              f"{'direct P99':>11} {'router P99':>11} {'added P99':>10}   (ms)")
        for stream in (False, True):
            d, r = measure(engine, router, a.model, a.requests, stream)
            diff = r - d
            print(f"{'streamed' if stream else 'unary':<12} {np.percentile(d, 50):11.2f} {np.percentile(r, 50):11.2f} "
                  f"{np.percentile(diff, 50):10.2f} {np.percentile(d, 99):11.2f} {np.percentile(r, 99):11.2f} "
                  f"{np.percentile(diff, 99):10.2f}")
    finally:
        for p in reversed(procs):
            stop(p)


if __name__ == "__main__":
    main()
