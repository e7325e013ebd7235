"""Streamed runs (issue 10, item 4): records to disk as requests end, streaming statistics, streamed arrivals.

The streamed run must write the same `requests.csv` byte for byte, the same stability verdicts, and the same
summary — exact fields equal, means to float rounding, latency percentiles within the stated bound — as the
in-memory run. (Peak memory against N is measured in `benchmarks/sim_speed.py --scale`, not here: timed and
noisy.)
"""
from __future__ import annotations

import filecmp
import math

import numpy as np
import pytest

from tierserve.experiments.scenario import ScenarioConfig, run_scenario, should_stream, write_result
from tierserve.metrics import load_outputs
from tierserve.metrics.stability import run_stability
from tierserve.metrics.stream import PERCENTILE_ABS_S, PERCENTILE_REL, _Latency
from tierserve.sim import simulate
from tierserve.workload import RequestStream, WorkloadConfig, build_workload

LAT = ("ttft", "tpot", "ttlt", "normalized_latency")
PCT = ("p50", "p90", "p95", "p99")


def _cfg(n=1500, rate=9.0, local="vllm_priority", **cluster) -> ScenarioConfig:
    return ScenarioConfig.from_dict({
        "seed": 3, "cluster": {"num_replicas": 2, "local_policy": local, **cluster},
        "workload": {"num_requests": n, "arrivals": {"kind": "poisson", "rate": rate},
                     "lengths": {"kind": "fit", "dataset": "azure2023_conv", "max_total_tokens": 8192},
                     "tiers": {"num_tiers": 3, "mix": "enterprise"}}})


def _close(a: float, b: float, rel: float, abs_: float = 0.0) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return abs(a - b) <= rel * abs(a) + abs_


def assert_summaries_match(mem, st) -> None:
    assert list(mem.tiers) == list(st.tiers)
    for name in mem.tiers:
        x, y = mem[name].to_dict(), st[name].to_dict()
        for k, v in x.items():
            if k in LAT:
                assert y[k]["n"] == v["n"], (name, k)
                assert _close(v["max"], y[k]["max"], 0.0), (name, k)
                assert _close(v["mean"], y[k]["mean"], 1e-12), (name, k)
                for p in PCT:
                    assert _close(v[p], y[k][p], PERCENTILE_REL * (1 + 1e-9), PERCENTILE_ABS_S), (name, k, p)
            else:                                  # counts, attainment, rates, TBT: exact
                assert v == y[k] or (v != v and y[k] != y[k]), (name, k, v, y[k])
    ex = {k: v for k, v in st.extras.items() if k != "streaming"}
    assert ex == mem.extras
    assert "streaming" in st.extras and st.extras["streaming"]["percentile_rel_error"] == PERCENTILE_REL


@pytest.mark.parametrize("kw", [
    {},                                                                     # stable, everything finishes
    {"rate": 30.0, "time_limit_s": 40.0},                                   # overloaded, cut: censored + never arrived
    {"local": "vllm", "cluster_policy": "jsq"},
])
def test_streamed_run_matches_in_memory(tmp_path, kw):
    cluster = {k: v for k, v in kw.items() if k not in ("rate", "local")}
    cfg = _cfg(rate=kw.get("rate", 9.0), local=kw.get("local", "vllm_priority"), **cluster)
    mem = run_scenario(cfg)
    write_result(mem, tmp_path / "mem")
    st = run_scenario(cfg, stream=True, outdir=tmp_path / "st")
    assert st.streamed and st.table is None and st.sim.states == []
    write_result(st, tmp_path / "st")
    assert filecmp.cmp(tmp_path / "mem" / "requests.csv", tmp_path / "st" / "requests.csv", shallow=False)
    assert_summaries_match(mem.summary, st.summary)
    mem_v = run_stability(mem.table, mem.sim.duration_s, mem.workload.tier_set)
    assert {k: v.to_dict() for k, v in mem_v.items()} == {k: v.to_dict() for k, v in st.stability.items()}
    assert st.sim.stats["relegated"] == mem.sim.stats["relegated"]
    assert load_outputs(tmp_path / "st").table.equals(mem.table)
    if "time_limit_s" in kw:
        assert mem.summary.all.censored > 0
    assert not list((tmp_path / "st").glob("*.partial"))


def test_streamed_without_outdir_and_parquet(tmp_path):
    pytest.importorskip("pyarrow")
    cfg = _cfg(n=800)
    mem = run_scenario(cfg)
    bare = run_scenario(cfg, stream=True)               # statistics only, no per-request file
    assert_summaries_match(mem.summary, bare.summary)
    st = run_scenario(cfg, stream=True, outdir=tmp_path, records="parquet")
    paths = write_result(st, tmp_path)
    assert "requests.parquet" in paths and not (tmp_path / "requests.csv").exists()
    out = load_outputs(tmp_path)
    assert out.table.equals(mem.table)


def test_interrupted_streamed_run_leaves_nothing_that_looks_whole(tmp_path):
    cfg = _cfg(n=3000)

    def stop(done, total):
        if done > 1000:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_scenario(cfg, progress=stop, stream=True, outdir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_sink_gets_every_request_once():
    cfg = _cfg(n=600, rate=30.0)
    got = []

    class Sink:
        def add(self, index, state, reason):
            got.append((index, state.id, reason))

    wl = build_workload(cfg.workload, cfg.seed)
    c = cfg.cluster.model_copy(update={"time_limit_s": 15.0})
    res = simulate(c, wl.requests, 3, sink=Sink())
    assert res.streamed and res.states == [] and res.reasons == {}
    assert sorted(i for i, _, _ in got) == list(range(600))
    assert all(i == rid for i, rid, _ in got)
    assert any(r and "time limit" in r for _, _, r in got)


@pytest.mark.parametrize("arrivals", [
    {"kind": "poisson", "rate": 5.0},
    {"kind": "gamma", "rate": 5.0, "cv": 3.0},
    {"kind": "piecewise", "rates": [5, 0, 15], "durations_s": [10, 5, 20], "cv": 2.0},
    {"kind": "diurnal", "mean_rate": 4.0, "period_s": 600},
])
def test_request_stream_equals_built_workload(arrivals):
    """Arrivals and tiers are drawn block by block bit for bit (so block size does not matter for them); lengths
    per block, so a block size of STREAM_BLOCK (2^20) reproduces one call for any run up to that size."""
    cfg = WorkloadConfig.from_dict({
        "num_requests": 1000, "seed": 11, "arrivals": arrivals,
        "lengths": {"kind": "choice", "options": [{"prompt": 100, "output": 20, "weight": 1.0},
                                                   {"prompt": 2000, "output": 300, "weight": 0.25}]},
        "tiers": {"num_tiers": 3, "mix": "enterprise"}})
    built = build_workload(cfg).requests
    assert list(RequestStream(cfg, block=7)) == built
    assert list(RequestStream(cfg)) == built


def test_request_stream_reads_forward_only():
    s = RequestStream(WorkloadConfig.from_dict({"num_requests": 50, "seed": 1,
                                                "arrivals": {"kind": "poisson", "rate": 5.0}}), block=8)
    assert s[0].id == 0 and s[1].id == 1 and s[1].id == 1 and s[20].id == 20 and len(s) == 50
    with pytest.raises(IndexError):
        s[3]


def test_should_stream_threshold():
    assert not should_stream(_cfg(n=1000))
    assert should_stream(_cfg(n=1000), True)
    assert should_stream(_cfg(n=300_000)) and not should_stream(_cfg(n=300_000), False)


@pytest.mark.parametrize("dist", ["lognormal", "uniform", "ties", "tiny", "small"])
def test_streamed_percentiles_within_stated_bound(dist):
    rng = np.random.default_rng(0)
    v = {"lognormal": lambda: rng.lognormal(-1.0, 1.5, 20000),
         "uniform": lambda: rng.uniform(0.01, 30.0, 5000),
         "ties": lambda: np.repeat(rng.uniform(0.1, 1.0, 50), 40),
         "tiny": lambda: rng.uniform(0.0, 3e-6, 1000),
         "small": lambda: rng.lognormal(0.0, 2.0, 7)}[dist]()
    acc = _Latency()
    for x in v.tolist():
        acc.add(x)
    got = acc.stats()
    want = np.percentile(v, [50, 90, 95, 99])
    assert got.n == v.size and got.max == v.max()
    assert got.mean == pytest.approx(v.mean(), rel=1e-12)
    for g, w in zip((got.p50, got.p90, got.p95, got.p99), want):
        assert abs(g - w) <= PERCENTILE_REL * (1 + 1e-9) * w + PERCENTILE_ABS_S
