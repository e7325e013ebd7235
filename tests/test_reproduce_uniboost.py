"""`tierserve reproduce uniboost --quick` as a smoke run whose outputs must show what the study is about:
capacity-normalised loads, verdicts on every row, intervals over seeds, srpt as the reference, and the
starvation test's per-class numbers; plus the workload mix it runs on."""
from __future__ import annotations

import json
import math
import re

import numpy as np
from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.experiments.uniboost import Setup, mixed_requests
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
        assert r["verdict"].startswith(("stable", "unstable"))
    srpt_row = next(line for line in md.splitlines() if line.startswith("| srpt |") and "%" in line)
    assert srpt_row.count("+0%") >= 9                       # the reference row is zero by construction
    assert re.search(r"Headline at ρ = 0\.9: UniBoost vs srpt — P99 TTLT [+-]\d+%", md)
    st = [r for r in rows if r["section"] == "starvation"]
    assert st and all(r["long_e2e.p50"] > r["short_e2e.p50"] for r in st)    # 6k decodes take longer
    assert all(math.isfinite(r["long_slope_s_per_req"]) for r in st)
    assert "± " in md                                       # 95% intervals over seeds
