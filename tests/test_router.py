"""`tierserve router` against stand-in engines on loopback (tierserve.router.fake_engine, one process each):
config refusals, tier resolution, the policy view, caps and overflow, a bounded mixed-tier load with every request
accounted for, and faults (an engine killed mid-stream and back, a slow engine, bad bodies and headers, clients
that leave). The real-vLLM path is tests/test_router_vllm.py."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tierserve.core import ConfigError
from tierserve.policies.cluster import CLUSTER_POLICIES
from tierserve.policies.cluster.base import InstanceView, LoadCounters
from tierserve.router.config import RouterConfig
from tierserve.router.engines import parse_metrics
from tierserve.router.fake_engine import FakeEngine as FakeApp
from tierserve.router.serve import AppThread, RouterThread, free_port
from tierserve.router.tiers import RequestRefused, TierResolver
from tierserve.router.view import EngineView

ROOT = Path(__file__).resolve().parents[1]
TIERS = [{"name": "gold", "slo": {"ttft_s": 0.5, "tbt_s": 0.05}, "service_tier": "priority", "gateway_priority": 10},
         {"name": "silver", "slo": {"ttft_s": 2.0}, "gateway_priority": 0},
         {"name": "bronze"}]


class ThreadEngine(AppThread):
    """A fake vLLM server on a thread of the test process (fast to start)."""

    def __init__(self, **kw) -> None:
        port = free_port()
        self.engine = FakeApp(name=f"fake{port}", **kw)
        super().__init__(self.engine.app, port=port, lifespan="off")

    def debug(self) -> dict:
        return httpx.get(f"{self.url}/debug", timeout=5).json()

    def kill(self) -> None:
        self.stop()


class FakeEngine:
    """A fake vLLM server in its own process on a loopback port (killed with SIGKILL, restartable)."""

    def __init__(self, *args: str, port: int | None = None) -> None:
        self.args = args
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "FakeEngine":
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
        self.proc = subprocess.Popen([sys.executable, "-m", "tierserve.router.fake_engine", "--port", str(self.port),
                                      *self.args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/health", timeout=1)
                return self
            except httpx.HTTPError:
                assert self.proc.poll() is None, "the fake engine exited"
                time.sleep(0.05)
        raise AssertionError(f"fake engine on {self.url} did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def debug(self) -> dict:
        return httpx.get(f"{self.url}/debug", timeout=5).json()


@pytest.fixture(scope="module")
def engines():
    pair = [ThreadEngine(token_delay_s=0.002).start(),
            ThreadEngine(token_delay_s=0.002, kv_metric="gpu_cache_usage_perc").start()]
    yield pair
    for e in pair:
        e.kill()


def config(engines, **over) -> RouterConfig:
    data = {"engines": [{"url": e.url} for e in engines], "tiers": TIERS, "scrape_interval_s": 0.05,
            "service_tiers": {"priority": "gold", "default": "silver", "flex": "bronze"},
            "api_keys": {"sk-gold": "gold"}, "criticalities": {"Critical": "gold", "Sheddable": "bronze"},
            "log_requests": False}
    data.update(over)
    return RouterConfig.from_dict(data)


def wait_until(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def stats(router: RouterThread) -> dict:
    return httpx.get(f"{router.url}/stats", timeout=5).json()


COMPLETION = {"model": "fake-model", "prompt": "t1 t2 t3", "max_tokens": 4}


# ---- configuration ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change,field", [
    ({"tiers": [{"name": "a", "overflow": "downgrade"}]}, "tiers.0.overflow"),
    ({"cluster_policy": "nope"}, "cluster_policy"),
    ({"cluster_policy": "deadline_slack"}, "cluster_policy"),
    ({"cluster_policy": "tierserve"}, "cluster_policy"),     # reads each engine's step model: none in the router
    ({"api_keys": {"k": "platinum"}}, "api_keys.k"),
    ({"engines": [{"url": "ftp://x"}]}, "engines.0.url"),
    ({"engines": [{"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:1"}]}, "engines.1.url"),
    ({"engines": []}, "engines"),
    ({"tiers": [{"name": "a", "max_in_flight": -1}]}, "tiers.0.max_in_flight"),
    ({"tiers": [{"name": "a", "gateway_priority": 1}, {"name": "b", "gateway_priority": 5}]}, "tiers.1.gateway_priority"),
    ({"cluster_policy": "llumnix", "cluster_policy_params": {"num_tiers": "two"}},
     "cluster_policy_params.num_tiers"),
    ({"criticalities": {"Urgent": "a"}, "tiers": [{"name": "a"}]}, "criticalities.Urgent"),
    ({"scrape_interval_s": 0}, "scrape_interval_s"),
    ({"engine_timeout_s": True}, "engine_timeout_s"),
    ({"colour": "blue"}, "colour"),
])
def test_bad_config_is_refused_naming_the_field(change, field):
    data = {"engines": [{"url": "http://127.0.0.1:9"}], **change}
    with pytest.raises(ConfigError) as e:
        RouterConfig.from_dict(data)
    assert e.value.field == field, str(e.value)


def test_cli_check_refuses_a_bad_file_with_the_field_and_accepts_a_good_one(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engines: [{url: 'http://127.0.0.1:9'}]\ntiers: [{name: g, max_queued: lots}]\n")
    good = tmp_path / "good.yaml"
    good.write_text("engines: [{url: 'http://127.0.0.1:9'}]\ntiers: [{name: g}, {name: b}]\ncluster_policy: llumnix\n")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, "-m", "tierserve", "router", "--config", str(bad), "--check"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2 and "tiers.0.max_queued" in out.stderr and "Traceback" not in out.stderr, out.stderr
    from typer.testing import CliRunner

    from tierserve.cli import app
    ok = CliRunner().invoke(app, ["router", "--config", str(good), "--check"])
    assert ok.exit_code == 0 and "valid" in ok.output and "llumnix" in ok.output, ok.output


# ---- tier resolution ----------------------------------------------------------------------------------------

def test_tier_sources_apply_in_order_and_gateway_priority_is_inverted():
    r = TierResolver(config([FakeEngine(port=9)]))
    every = {"authorization": "Bearer sk-gold", "x-tier": "bronze", "x-gateway-inference-criticality": "Sheddable",
             "x-gateway-inference-priority": "-3", "x-llm-d-slo-ttft-ms": "100"}
    body = {"service_tier": "flex"}
    assert r.resolve(every, body).source == "api_key" and r.resolve(every, body).tier == 0
    every.pop("authorization")
    assert (r.resolve(every, body).tier, r.resolve(every, body).source) == (2, "tier_header")
    every.pop("x-tier")
    assert (r.resolve(every, body).tier, r.resolve(every, body).source) == (2, "service_tier")
    assert r.resolve(every, {"service_tier": "priority"}).tier == 0
    assert (r.resolve(every, {}).tier, r.resolve(every, {}).source) == (2, "criticality")
    every.pop("x-gateway-inference-criticality")
    # gateway priorities: higher = more important; they land in the tier index order vLLM runs first
    assert [r.resolve({"x-gateway-inference-priority": p}, {}).tier for p in ("50", "10", "3", "0", "-3")] \
        == [0, 0, 1, 1, 2]
    every.pop("x-gateway-inference-priority")
    # llm-d SLO headers: the least important tier at least as tight; tighter than every tier: tier 0
    assert r.resolve({"x-llm-d-slo-ttft-ms": "3000"}, {}).tier == 1
    assert r.resolve({"x-llm-d-slo-ttft-ms": "100"}, {}).tier == 0
    got = r.resolve({"x-tier": "silver", "x-llm-d-slo-ttft-ms": "750", "x-llm-d-slo-tpot-ms": "40"}, {})
    assert (got.tier, got.slo.ttft_s, got.slo.tbt_s) == (1, 0.75, 0.04)      # headers override the tier's SLO
    assert r.resolve({}, {}).source == "default" and r.resolve({}, {}).tier == 2
    assert r.resolve({"authorization": "Bearer unknown-key"}, {}).tier == 2   # unknown key: not a tier source


@pytest.mark.parametrize("headers,body,param", [
    ({"x-tier": "platinum"}, {}, "x-tier"),
    ({"x-tier": "7"}, {}, "x-tier"),
    ({}, {"service_tier": "turbo"}, "service_tier"),
    ({"x-gateway-inference-criticality": "Urgent"}, {}, "x-gateway-inference-criticality"),
    ({"x-gateway-inference-priority": "high"}, {}, "x-gateway-inference-priority"),
    ({"x-llm-d-slo-ttft-ms": "-5"}, {}, "x-llm-d-slo-ttft-ms"),
    ({"x-llm-d-slo-ttft-ms": "0"}, {}, "x-llm-d-slo-ttft-ms"),
    ({"x-llm-d-slo-tpot-ms": "1e300"}, {}, "x-llm-d-slo-tpot-ms"),
    ({"x-llm-d-slo-tpot-ms": "nan"}, {}, "x-llm-d-slo-tpot-ms"),
])
def test_unknown_tier_and_bad_slo_headers_are_400s_naming_the_field(headers, body, param):
    r = TierResolver(config([FakeEngine(port=9)]))
    with pytest.raises(RequestRefused) as e:
        r.resolve(headers, body)
    assert e.value.status == 400 and e.value.param == param and param in e.value.message


# ---- the policy's view --------------------------------------------------------------------------------------

VLLM_METRICS = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:KV_NAME{engine="0",model_name="m"} 0.25
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 40.0
vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="64"} 1.0
"""


@pytest.mark.parametrize("kv_name", ["kv_cache_usage_perc", "gpu_cache_usage_perc"])
def test_metrics_parse_into_the_view_with_in_flight_accounting_between_scrapes(kv_name):
    s = parse_metrics(VLLM_METRICS.replace("KV_NAME", kv_name))
    assert (s.running, s.waiting, s.kv_usage, s.total_blocks, s.block_size) == (3, 2, 0.25, 64, 32)
    assert s.kv_metric == f"vllm:{kv_name}"
    v = EngineView("http://e", 0, 0, 1 << 20, 16, 4, ready=True)
    v.scraped(s)
    assert (v.total_blocks, v.block_size, v.num_running, v.num_queued, v.used_blocks) == (64, 32, 3, 2, 16)
    from tierserve.core import Request, RequestState
    a, b = (RequestState(Request(i, 0.0, 100, 10, tier=i)) for i in (1, 2))
    v.sent(a)
    v.sent(b)                           # sent since the scrape: waiting, with their prompt blocks committed
    assert (v.num_outstanding, v.num_running, v.num_queued, v.used_blocks) == (7, 3, 4, 16 + 4 + 4)
    assert v.tier_counts == {1: 1, 2: 1} and v.waiting_demand_blocks == 0   # the router's 2 are taken as running
    v.ended(a)
    assert v.num_outstanding == 6
    v.scraped(parse_metrics(VLLM_METRICS.replace("KV_NAME", kv_name).replace(" 4.0", " 5.0")))
    assert v.num_outstanding == 5 and v.preempted_recently and v.num_preempted_waiting == 1


def _protocol_members(proto) -> set[str]:
    return {n for n in vars(proto) if not n.startswith("_")} | set(getattr(proto, "__annotations__", {}))


def test_engine_view_is_the_simulators_instance_view_and_every_router_policy_dispatches_over_it():
    v = EngineView("http://e", 0, 0, 64, 16, 4, ready=True)
    missing = sorted(n for n in _protocol_members(InstanceView) | _protocol_members(LoadCounters)
                     if not hasattr(v, n))
    assert not missing, missing
    from tierserve.core import Request, RequestState
    views = [EngineView(f"http://e{i}", i, i, 64, 16, 4, ready=True) for i in range(3)]
    for i, n in enumerate((5, 0, 2)):         # engine 1 idle, engine 0 busiest
        views[i].scraped(parse_metrics(f'vllm:num_requests_running{{engine="0"}} {n}\n'
                                       f'vllm:kv_cache_usage_perc{{engine="0"}} {n / 10}\n'))
    chosen = {}
    for name in CLUSTER_POLICIES.names:
        cls = CLUSTER_POLICIES.get_class(name)
        if getattr(cls, "uses_deadline_load", False):
            continue                            # refused by the router's config (no step model)
        params = {"pools": [[0], [1]], "pool_replicas": [1, 2]} if name == "silo" else {}
        policy = CLUSTER_POLICIES.create(name, **params)
        policy.setup(3, 0)
        try:
            target = policy.dispatch(RequestState(Request(1, 0.0, 64, 8, tier=1)), views, 0.0)
        except ConfigError as e:               # a policy needing more than the view has refuses, naming it
            chosen[name] = f"refused: {e.field}"
            continue
        assert target in (0, 1, 2, None), (name, target)
        chosen[name] = target
    assert chosen["jsq"] == chosen["infaas"] == chosen["llumnix"] == chosen["llumnix_k"] == 1, chosen
    assert {chosen[n] for n in ("round_robin", "random", "silo")} <= {0, 1, 2}, chosen


# ---- the router on loopback --------------------------------------------------------------------------------

def test_tier_and_slo_reach_the_engine_and_the_served_tier_is_echoed(engines):
    with RouterThread(config(engines, cluster_policy="round_robin")) as r:
        before = [len(e.debug()["received"]) for e in engines]
        c = httpx.Client(base_url=r.url, timeout=10)
        a = c.post("/v1/completions", json={**COMPLETION, "service_tier": "priority", "priority": 99,
                                              "vllm_xargs": {"tier": 5, "session_id": "s1"}})
        b = c.post("/v1/chat/completions", json={"model": "fake-model", "max_tokens": 3,
                                                 "messages": [{"role": "user", "content": "hi"}]},
                   headers={"x-tier": "silver", "x-llm-d-slo-tpot-ms": "80"})
        assert a.status_code == b.status_code == 200
        assert a.json()["service_tier"] == "priority" and b.json()["service_tier"] == "silver"
        assert c.get("/v1/models").json()["data"][0]["id"] == "fake-model"
        got = [rec for e, n in zip(engines, before) for rec in e.debug()["received"][n:]]
    by_path = {g["path"]: g for g in got}
    gold = by_path["/v1/completions"]
    assert gold["priority"] == 0 and gold["vllm_xargs"] == {"session_id": "s1", "tier": 0, "ttft_s": 0.5,
                                                             "tbt_s": 0.05}
    assert gold["service_tier"] is None          # the router's decision, not the client's field, goes on
    silver = by_path["/v1/chat/completions"]
    assert silver["priority"] == 1 and silver["vllm_xargs"] == {"tier": 1, "ttft_s": 2.0, "tbt_s": 0.08}


def test_streamed_chunks_carry_the_served_tier(engines):
    with RouterThread(config(engines)) as r:
        with httpx.Client(base_url=r.url, timeout=10) as c, \
                c.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True},
                         headers={"authorization": "Bearer sk-gold"}) as s:
            lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) == COMPLETION["max_tokens"] + 1
    assert all('"service_tier":"priority"' in ln for ln in lines[:-1])


def test_caps_downgrade_queue_and_reject_with_retry_after(engines):
    tiers = [{"name": "gold", "max_in_flight": 1, "overflow": "downgrade"},
             {"name": "silver", "max_in_flight": 1, "overflow": "queue", "max_queued": 1, "queue_timeout_s": 5},
             {"name": "bronze", "max_in_flight": 1, "overflow": "reject", "retry_after_s": 7}]
    # 1.2 s at the stand-in engine, arrivals 0.2 s apart: the first four overlap even on a loaded machine
    slow = {**COMPLETION, "max_tokens": 600}
    with RouterThread(config(engines, tiers=tiers)) as r:
        async def run():
            async with httpx.AsyncClient(base_url=r.url, timeout=20) as c:
                async def post(tier, body=slow, delay=0.0):
                    await asyncio.sleep(delay)
                    return await c.post("/v1/completions", json=body, headers={"x-tier": tier})
                return await asyncio.gather(post("gold"), post("gold", delay=0.2), post("gold", delay=0.4),
                                            post("gold", delay=0.6), post("bronze", delay=0.8))
        g1, g2, g3, g4, b1 = asyncio.run(run())
        s = stats(r)
    # gold 1 runs; gold 2 downgrades to silver; gold 3 downgrades and waits in silver's queue; gold 4 finds that
    # queue full: 429; bronze's one slot went to nobody yet, so bronze runs
    assert [x.status_code for x in (g1, g2, g3, g4, b1)] == [200, 200, 200, 429, 200]
    assert [x.json().get("service_tier") for x in (g1, g2, g3)] == ["gold", "silver", "silver"]
    assert g4.headers["retry-after"] == "1" and "queue is full" in g4.json()["error"]["message"]
    assert s["outcomes"] == {"finished": 4, "shed": 1}
    with RouterThread(config(engines, tiers=tiers)) as r:
        async def bronze_pair():
            async with httpx.AsyncClient(base_url=r.url, timeout=20) as c:
                one = asyncio.ensure_future(c.post("/v1/completions", json=slow, headers={"x-tier": "bronze"}))
                await asyncio.sleep(0.1)
                two = await c.post("/v1/completions", json=slow, headers={"x-tier": "bronze"})
                return await one, two
        one, two = asyncio.run(bronze_pair())
    assert one.status_code == 200 and two.status_code == 429 and two.headers["retry-after"] == "7"


def test_bounded_mixed_tier_load_every_request_answered_or_refused_and_counted(engines):
    n = 150
    tiers = [{"name": "gold", "max_in_flight": 6, "overflow": "downgrade", "service_tier": "priority"},
             {"name": "silver", "max_in_flight": 6, "overflow": "queue", "max_queued": 30, "queue_timeout_s": 20},
             {"name": "bronze", "max_in_flight": 2, "overflow": "reject"}]
    before = [e.debug() for e in engines]
    with RouterThread(config(engines, tiers=tiers, cluster_policy="llumnix",
                             cluster_policy_params={"num_tiers": 3})) as r:
        async def run():
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(base_url=r.url, timeout=30, limits=limits) as c:
                async def one(i):
                    await asyncio.sleep(0.004 * i)          # ~1 s of arrivals, then the queue drains
                    tier = ("gold", "silver", "bronze")[i % 3]
                    body = {**COMPLETION, "max_tokens": 5 + (i * 7) % 40, "stream": i % 2 == 0}
                    if body["stream"]:
                        async with c.stream("POST", "/v1/completions", json=body, headers={"x-tier": tier}) as s:
                            text = (await s.aread()).decode()
                            return s.status_code, text
                    resp = await c.post("/v1/completions", json=body, headers={"x-tier": tier})
                    return resp.status_code, resp.text
                return await asyncio.gather(*(one(i) for i in range(n)))
        t0 = time.monotonic()
        results = asyncio.run(asyncio.wait_for(run(), 60))
        wall = time.monotonic() - t0
        s = stats(r)
        prom = httpx.get(f"{r.url}/metrics").text
    after = [e.debug() for e in engines]
    codes = Counter(code for code, _ in results)
    # how many are shed depends on the stand-in engines' speed against the arrivals; at least every tier's first
    # wave (its in-flight cap) is answered, and every refusal is a 429 or 503
    assert set(codes) <= {200, 429, 503} and codes[200] >= 6 + 6 + 2, codes
    assert sum(s["outcomes"].values()) == n and s["outcomes"].get("finished", 0) == codes[200]
    assert s["outcomes"].get("shed", 0) == codes[429] and s["outcomes"].get("unavailable", 0) == codes[503]
    assert s["in_flight"] == {"gold": 0, "silver": 0, "bronze": 0} and s["queued"] == {"gold": 0, "silver": 0,
                                                                                     "bronze": 0}
    # none lost, none duplicated: the engines finished exactly the answered requests, each once
    finished = sum(a["finished"] - b["finished"] for a, b in zip(after, before))
    received = sum(len(a["received"]) - len(b["received"]) for a, b in zip(after, before))
    assert finished == received == codes[200]
    ids = [text.split('"id":"')[1].split('"')[0] for code, text in results if code == 200]
    assert len(ids) == len(set(ids)) == codes[200]
    assert all(text.rstrip().endswith("data: [DONE]") for (code, text), i in zip(results, range(n))
               if code == 200 and i % 2 == 0)
    assert 'tierserve:requests_total{outcome="finished"' in prom and "tierserve:time_to_first_token_seconds_bucket" in prom
    assert wall < 60


def test_client_leaving_cancels_the_engine_request(engines):
    with RouterThread(config(engines)) as r:
        before = sum(e.debug()["aborted"] for e in engines)
        long = {**COMPLETION, "max_tokens": 2000}          # 4 s at the fake engine
        with httpx.Client(base_url=r.url, timeout=10) as c, \
                c.stream("POST", "/v1/completions", json={**long, "stream": True}) as s:
            next(s.iter_lines())                            # one chunk, then hang up
        with pytest.raises(httpx.ReadTimeout):               # a non-streamed client that gives up
            httpx.post(f"{r.url}/v1/completions", json=long, timeout=0.5)
        wait_until(lambda: sum(e.debug()["aborted"] for e in engines) == before + 2)
        wait_until(lambda: stats(r)["outcomes"].get("cancelled") == 2)
        assert stats(r)["in_flight"]["bronze"] == 0


def test_engine_killed_mid_stream_clean_error_marked_down_rest_served_then_back():
    victim = FakeEngine("--token-delay-s", "0.02").start()
    healthy = ThreadEngine().start()
    try:
        with RouterThread(config([victim, healthy], cluster_policy="round_robin")) as r:
            c = httpx.Client(base_url=r.url, timeout=10)
            with c.stream("POST", "/v1/completions", json={**COMPLETION, "max_tokens": 200, "stream": True}) as s:
                lines = s.iter_lines()
                first = next(lines)
                victim.kill()                                 # SIGKILL mid-stream
                rest = list(lines)
            assert s.status_code == 200 and first.startswith("data: {")
            events = [ln for ln in rest if ln]
            assert '"error"' in events[-2] and "mid-stream" in events[-2] and events[-1] == "data: [DONE]"
            wait_until(lambda: not stats(r)["engines"][0]["ready"])
            served = [c.post("/v1/completions", json=COMPLETION) for _ in range(6)]
            assert [x.status_code for x in served] == [200] * 6
            assert stats(r)["outcomes"] == {"error": 1, "finished": 6}
            assert 'tierserve:engine_up{engine="%s"} 0.0' % victim.url in c.get("/metrics").text
            victim.start()                                    # the same port: the engine comes back
            wait_until(lambda: stats(r)["engines"][0]["ready"])
            for _ in range(4):
                assert c.post("/v1/completions", json=COMPLETION).status_code == 200
            assert len(victim.debug()["received"]) >= 1        # round robin sends it work again
            healthy.kill()
            victim.kill()
            wait_until(lambda: not any(e["ready"] for e in stats(r)["engines"]))
            down = c.post("/v1/completions", json=COMPLETION)
            assert down.status_code == 503 and down.headers["retry-after"] == "5"
            assert c.get("/ready").status_code == 503 and c.get("/health").status_code == 200
            assert sum(stats(r)["outcomes"].values()) == 12
    finally:
        victim.kill()
        healthy.kill()


def test_slow_engine_times_out_cleanly_and_bad_bodies_are_refused(engines):
    slow = ThreadEngine(first_token_delay_s=5.0).start()
    try:
        with RouterThread(config([slow], engine_timeout_s=0.5, max_body_bytes=2048)) as r:
            c = httpx.Client(base_url=r.url, timeout=10)
            x = c.post("/v1/completions", json=COMPLETION)
            assert x.status_code == 504 and "in time" in x.json()["error"]["message"]
            with c.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}) as s:
                text = s.read().decode()
            assert '"error"' in text and "silent" in text
            bad = [c.post("/v1/completions", content=b"{not json"),
                   c.post("/v1/completions", content=b"[1, 2]"),
                   c.post("/v1/completions", content=b'{"prompt": "' + b"x" * 4096 + b'"}'),
                   c.post("/v1/completions", json={**COMPLETION, "max_tokens": -3}),
                   c.post("/v1/completions", json={**COMPLETION, "stream": "yes"}),
                   c.post("/v1/completions", json=COMPLETION, headers={"x-tier": "platinum"}),
                   c.post("/v1/completions", json=COMPLETION, headers={"x-llm-d-slo-ttft-ms": "-1"})]
            assert [b.status_code for b in bad] == [400, 400, 413, 400, 400, 400, 400]
            assert all(b.json()["error"]["type"] == "invalid_request_error" for b in bad)
            assert stats(r)["outcomes"] == {"engine_timeout": 2, "bad_request": 7}
            assert c.get("/health").status_code == 200              # and the router is still up
    finally:
        slow.kill()


def test_jsq_sends_less_to_a_slow_engine(engines):
    slow = ThreadEngine(first_token_delay_s=3.0).start()     # holds each request 3 s; the other answers in ms
    try:
        with RouterThread(config([engines[0], slow], cluster_policy="jsq")) as r:
            async def run():
                async with httpx.AsyncClient(base_url=r.url, timeout=30) as c:
                    async def one(i):
                        await asyncio.sleep(0.05 * i)
                        return (await c.post("/v1/completions", json={**COMPLETION, "max_tokens": 4})).status_code
                    return await asyncio.gather(*(one(i) for i in range(20)))
            before = len(engines[0].debug()["received"])
            assert asyncio.run(run()) == [200] * 20
            fast_n = len(engines[0].debug()["received"]) - before
            slow_n = len(slow.debug()["received"])
        # while the fast one keeps up, ties go to it (index 0); once it lags, the slow one fills up after a few
        assert fast_n + slow_n == 20 and slow_n <= 6, (fast_n, slow_n)
    finally:
        slow.kill()
