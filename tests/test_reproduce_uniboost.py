"""`tierserve reproduce uniboost --quick` as a smoke run whose outputs must show what the study is about:
capacity-normalised loads, verdicts on every row, intervals over seeds, srpt as the reference, and the
starvation test's per-class numbers; plus the workload mix it runs on."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.experiments.results_doc import read_section
from tierserve.experiments.uniboost import METRICS, Setup, mixed_requests
from tierserve.workload.mixes import reasoning_chat_lengths


def test_reasoning_mix_has_the_stated_share_and_fits_the_context():
    lens = reasoning_chat_lengths(20_000, np.random.default_rng(0), 0.7, max_total=8192)
    assert abs(lens.reasoning.mean() - 0.7) < 0.02
    assert (lens.prompts + lens.outputs <= 8192).all() and (lens.outputs >= 1).all()
    # reasoning requests decode far longer than chat ones (the point of the mix)
    assert np.median(lens.outputs[lens.reasoning]) > 3 * np.median(lens.outputs[~lens.reasoning])


def test_common_random_numbers_across_rates():
    a, b = mixed_requests(Setup(num_requests=50), 1.0, 3), mixed_requests(Setup(num_requests=50), 4.0, 3)
    assert [(r.prompt_tokens, r.output_tokens) for r in a] == [(r.prompt_tokens, r.output_tokens) for r in b]
    assert b[-1].arrival_s * 4.0 == a[-1].arrival_s or math.isclose(b[-1].arrival_s * 4.0, a[-1].arrival_s)


DOC = Path(__file__).resolve().parents[1] / "docs" / "results" / "uniboost.md"


def test_quick_reproduction_reports_table2_and_starvation(tmp_path):
    res = CliRunner().invoke(app, ["reproduce", "uniboost", "--quick", "--out", str(tmp_path), "--executor", "serial"])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "uniboost_report.md").read_text()
    rows = json.loads((tmp_path / "uniboost_runs.json").read_text())
    meta = json.loads((tmp_path / "uniboost_meta.json").read_text())
    caps = meta["capacities_rps"]
    # a finished study says so; partial output (written after every batch) is marked PARTIAL / INTERRUPTED
    assert meta["status"] == "complete" and meta["runs_done"] == meta["runs_total"] == len(rows)
    assert "PARTIAL" not in md and "INTERRUPTED" not in md
    assert re.search(r"\[\d+/\d+\] table2 uniboost ρ=0\.9: stable \d/3", res.stderr if res.stderr_bytes else res.output)
    assert all(v > 0 and math.isfinite(v) for v in caps.values())
    t2 = [r for r in rows if r["section"] == "table2"]
    assert {r["policy"] for r in t2} >= {"srpt", "fcfs", "uniboost", "distboost", "las", "sjf"}
    assert {r["seed"] for r in t2} == {0, 1, 2}
    for r in t2:           # loads are in units of the measured capacity, and every run has a verdict
        assert math.isclose(r["rate"], r["rho"] * caps["table2"], rel_tol=1e-9)
        assert r["verdict"] in ("stable", "unstable", "undecided")
    # the % columns are computed from the runs: uniboost's P99 TTLT change vs srpt, seed by seed, recomputed here
    by = {(r["label"], r["seed"]): r for r in t2 if r["rho"] == 0.9}
    gains = [100 * (by[("srpt", s)]["ttlt.p99"] - by[("uniboost", s)]["ttlt.p99"]) / by[("srpt", s)]["ttlt.p99"]
             for s in (0, 1, 2)]
    ub_row = next(line for line in md.splitlines() if line.startswith("| uniboost |") and "%" in line)
    assert ub_row.split(" | ")[1 + 1 + METRICS.index("ttlt.p99")].startswith(f"{np.mean(gains):+.0f}%"), ub_row
    # one change at a time: every stack swaps (or, UniBoost with MemGuard, picks); the recompute rows say so
    assert {r["preempt_mode"] for r in t2 if r["label"] in ("fcfs", "srpt", "sjf", "las")} == {"swap"}
    assert {r["preempt_mode"] for r in t2 if r["label"].endswith("[preempt_mode=recompute]")} == {"recompute"}
    assert "| srpt[preempt_mode=recompute] |" in md and "every stack preempts by **swap**" in md
    assert (read_section(DOC, "uniboost quick") or "").strip() == md.strip()    # the doc holds this output
    assert re.search(r"Headline at ρ = 0\.9: UniBoost vs srpt — P99 TTLT [+-]\d+%", md)
    st = [r for r in rows if r["section"] == "starvation"]
    assert st and all(r["long_e2e.p50"] > r["short_e2e.p50"] for r in st)    # 6k decodes take longer
    assert all(math.isfinite(r["long_slope_s_per_req"]) for r in st)
    assert "± " in md                                       # 95% intervals over seeds


# ---- replay, load profiles, the starvation trend, γ records (session 3) ----------------------------------------
import pytest  # noqa: E402
from dataclasses import asdict, replace  # noqa: E402

from tierserve.core import ConfigError  # noqa: E402
from tierserve.experiments.uniboost import (  # noqa: E402
    _same_setup, _saturation_run, long_request_trend, replay_replicas, run_point,
)


def test_replay_shares_partition_the_cluster_trace():
    su = Setup(num_requests=60, replay_of=8)
    shares = [mixed_requests(replace(su, replay_replica=r), 8.0, 5) for r in range(8)]
    ids = sorted(x.id for sh in shares for x in sh)
    assert ids == list(range(480))                          # every cluster request goes to exactly one replica
    whole = {x.id: x for x in mixed_requests(replace(su, replay_of=0, num_requests=480), 8.0, 5)}
    for sh in shares:                                      # a share is the cluster's requests, unchanged
        assert all((x.arrival_s, x.prompt_tokens, x.output_tokens) == (whole[x.id].arrival_s, whole[x.id].prompt_tokens,
                                                                       whole[x.id].output_tokens) for x in sh)
    assert 30 < np.mean([len(sh) for sh in shares]) < 90 and len({len(sh) for sh in shares}) > 1
    with pytest.raises(ConfigError, match="replay_replica"):
        mixed_requests(replace(su, replay_replica=8), 8.0, 0)
    with pytest.raises(ConfigError, match="arrivals"):
        mixed_requests(replace(su, arrivals="bursty"), 8.0, 0)
    assert replay_replicas(0, 32, 2) == [0, 16] and len(set(replay_replicas(3, 512, 2))) == 2


def test_rate_profile_scales_each_segment_and_keeps_the_draws():
    flat = mixed_requests(Setup(num_requests=400), 1.0, 2)
    steps = mixed_requests(Setup(num_requests=400, rate_profile=(0.5, 2.0)), 1.0, 2)
    gap = lambda rs, i: rs[i].arrival_s - rs[i - 1].arrival_s  # noqa: E731
    assert math.isclose(gap(steps, 10), 2.0 * gap(flat, 10)) and math.isclose(gap(steps, 300), 0.5 * gap(flat, 300))
    assert [r.output_tokens for r in flat] == [r.output_tokens for r in steps]
    with pytest.raises(ConfigError, match="rate_profile"):
        mixed_requests(Setup(num_requests=10, rate_profile=(1.0, 0.0)), 1.0, 0)


def test_long_request_trend_recovers_a_known_slope_per_cluster_request():
    rng = np.random.default_rng(0)
    x = np.sort(rng.uniform(0, 1000, 400))
    y = 100 + 0.05 * x + rng.normal(0, 5, 400)
    tr = long_request_trend(x, y, cluster_rate=20.0)
    assert abs(tr["long_slope_s_per_req"] - 0.05 / 20) < 2 * tr["long_slope_hw_s_per_req"]
    assert 0 < tr["long_slope_hw_s_per_req"] < 0.001
    assert math.isclose(tr["long_growth_s"], 0.05 * np.ptp(x), rel_tol=0.1)
    flat = long_request_trend(x, 100 + rng.normal(0, 5, 400), 20.0)   # no trend: the interval covers 0
    assert abs(flat["long_slope_s_per_req"]) < flat["long_slope_hw_s_per_req"]


def test_gamma_is_recorded_at_every_completion_and_moves_only_with_gamma_ada():
    su = asdict(Setup(name="gamma", num_requests=300, rate_profile=(0.4, 1.1), record_gamma=True))
    ada, fixed = run_point("uniboost", {}, su, 3.5, 0), run_point("uniboost_memguard", {"gamma": 1.0}, su, 3.5, 0)
    assert len(ada["gamma_trace"]) == len(fixed["gamma_trace"]) == 300
    assert {g for _, g, _ in fixed["gamma_trace"]} == {1.0}
    assert len({g for _, g, _ in ada["gamma_trace"]}) > 1                  # γ-Ada updated γ during the run
    assert len(ada["segment_starts_s"]) == 2 and "seg1.gamma.p50" in ada


def test_saturation_throughput_and_old_meta_comparison():
    rate = _saturation_run(asdict(Setup(name="s", workload="starvation", num_requests=150)), 0)
    assert math.isfinite(rate) and rate > 0
    old = {k: v for k, v in asdict(Setup()).items() if k not in ("arrivals", "rate_profile", "replay_of")}
    assert _same_setup(old, Setup()) and not _same_setup(old, Setup(arrivals="azure_conv"))


def test_unknown_section_is_a_clear_error(tmp_path):
    res = CliRunner().invoke(app, ["reproduce", "uniboost", "--sections", "table2,bogus", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "--sections" in res.output and "bogus" in res.output


# ---- Fig. 7 points on verdict-chosen run lengths (issue 23) -----------------------------------------------------
def test_fig7_points_run_until_the_verdict_is_decided():
    from tierserve.experiments.uniboost import Study, _jobs_for, point_most
    from tierserve.experiments.uniboost_report import run_lengths_table
    from tierserve.experiments.uniboost_runs import simulate_point
    su = replace(Study().fig7, num_requests=600)
    rate = 0.8 * 0.2806                        # ρ 0.8 of fcfs's measured capacity on this setup (docs/results)
    assert simulate_point("fcfs", {}, su, rate, 1, "swap")[2].work.verdict == "undecided"   # the case growth is for
    fixed = run_point("fcfs", {}, asdict(su), rate, 1, "swap")
    assert fixed["lengths"] == [600] and fixed["verdict"] == "undecided" and fixed["run_most"] is None
    grown = run_point("fcfs", {}, asdict(su), rate, 1, "swap", most=4800)
    ns = grown["lengths"]
    assert ns[0] == 600 and len(ns) > 1 and all(b == 2 * a for a, b in zip(ns, ns[1:])) and ns[-1] <= 4800
    assert grown["requests"] == ns[-1] and grown["run_most"] == 4800
    assert grown["verdict"] != "undecided" or ns[-1] == 4800       # decided, or stopped at the named bound
    # the study gives Fig. 7 (and its sensitivity tables) the bound, and no other section
    study = replace(Study(), sections=("table2", "fig7"), fig7=su)
    jobs = _jobs_for(study, {"table2": 1.0, "fig7": 0.28})
    assert {j["most"] for j in jobs if j["section"] == "fig7"} == {8 * 600}
    assert {j["most"] for j in jobs if j["section"] == "table2"} == {None}
    with pytest.raises(ConfigError, match="point_growth"):
        point_most(replace(study, point_growth=0), "fig7", su)
    table = "\n".join(run_lengths_table([{**grown, "section": "fig7", "label": "fcfs", "rho": 0.8}], "fig7",
                                        ("fcfs",), (0.8,)))
    assert f"| fcfs | {ns[-1]} {grown['verdict'][0]} |" in table
