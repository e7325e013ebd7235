"""The K-tier study: its class→tier mapping, recovery rule, and `tierserve reproduce ktier --quick` as a smoke run
whose outputs must show the regimes the study is about (a stable and an unstable load, capacity per class, the
overload episode, GPUs needed)."""
from __future__ import annotations

import csv
import math
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.experiments.ktier import (
    CLASS_NAMES, NUM_CLASSES, POISSON, RECOVERY_WINDOW_S, RunSetup, even_cuts, ktier_stack, ladder_stacks,
    ladder_ttft_s, llumnix_two_level, recovery_s, run_point, tier_of_class,
)


def test_classes_map_onto_k_tiers_in_order():
    for k in range(1, NUM_CLASSES + 1):
        tiers = tier_of_class(even_cuts(k))
        assert list(tiers) == [c * k // NUM_CLASSES for c in range(NUM_CLASSES)]
        assert tiers[0] == 0 and tiers[-1] == k - 1 and np.all(np.diff(tiers) >= 0)
    assert list(tier_of_class(even_cuts(10))) == list(range(10))          # one class per tier
    assert list(llumnix_two_level(1).class_tiers()) == [0] + [1] * 9      # Llumnix's 10% priority ratio
    assert list(llumnix_two_level(5).class_tiers()) == [0] * 5 + [1] * 5  # the 50% inversion row


def test_slo_ladder_does_not_change_with_k():
    setup = RunSetup(num_replicas=1, num_requests=60)
    runs = [run_point(ktier_stack(k), setup, POISSON, 2.0, 0) for k in (1, 10)]
    for c, name in enumerate(CLASS_NAMES):
        a, b = (r.summary.tiers[name] for r in runs)
        assert a.total == b.total                       # the same requests in each class at every K
        assert a.attainment_goal == b.attainment_goal == 0.95
    assert ladder_ttft_s(0) == 0.5 and all(ladder_ttft_s(c + 1) > ladder_ttft_s(c) for c in range(9))


def _episode(att_by_window, end_index=2, pre=1.0):
    total = [[10] * len(att_by_window)] * NUM_CLASSES
    met = [[round(10 * a) for a in att_by_window]] * NUM_CLASSES
    return {"total": total, "met": met, "end_index": end_index, "pre_attainment": [pre] * NUM_CLASSES}


def test_recovery_is_the_first_pair_of_recovered_windows_after_the_burst():
    # windows 0-1 before the burst's end; degraded until window 4, recovered from window 4 on
    ep = _episode([1.0, 0.2, 0.1, 0.5, 1.0, 1.0, 0.9, 1.0])
    assert recovery_s(ep, 3) == 2 * RECOVERY_WINDOW_S
    ep = _episode([1.0, 0.2, 1.0, 0.5, 1.0, 0.3, 1.0, 1.0])   # a single good window is not a recovery
    assert recovery_s(ep, 3) == 4 * RECOVERY_WINDOW_S
    assert recovery_s(_episode([1.0, 0.2, 1.0, 0.95, 1.0]), 1) == 0.0      # never degraded after the end
    assert math.isinf(recovery_s(_episode([1.0, 0.2, 0.1, 0.2, 0.5, 1.0]), 1))  # only the cut-off last window


def test_controls_change_one_thing_at_a_time():
    ladder = {s.label: s for s in ladder_stacks(4)}
    assert (ladder["fcfs"].local_policy, ladder["fcfs"].cluster_policy) == ("vllm", "infaas")
    assert ladder["local_prio"].local_policy == "vllm_priority" and ladder["local_prio"].cluster_policy == "infaas"
    h, both = ladder["headroom"].cluster_kwargs(), ladder["both"].cluster_kwargs()
    assert h == both and h["migration"] is False and h["hold_when_busy"] is False
    assert ladder["headroom"].local_policy == "vllm" and ladder["both"].local_policy == "vllm_priority"
    mig, hold = ladder["+migration"].cluster_kwargs(), ladder["+hold"].cluster_kwargs()
    assert (mig["migration"], mig["hold_when_busy"]) == (True, False)
    assert (hold["migration"], hold["hold_when_busy"]) == (True, True)
    assert all(s.cluster_kwargs().get("num_tiers", 4) == 4 for s in ladder.values())


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("ktier")
    res = CliRunner().invoke(app, ["reproduce", "ktier", "--quick", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return out


def test_quick_writes_every_table_and_figure(quick):
    for name in ("ktier_report.md", "ktier_capacity.csv", "ktier_rho.csv", "ktier_overload.csv", "ktier_gpus.csv",
                 "ktier_vs_local_priority.csv", "ktier_seed_table.csv", "ktier_meta.json",
                 "attainment_vs_rho_poisson.png", "capacity_vs_k.png"):
        assert (quick / name).stat().st_size > 0, name
    md = (quick / "ktier_report.md").read_text()
    assert "warm-up the verdict found" in md and "labelled" in md
    assert "## Capacity at two run lengths" in md and "the intervals overlap" in md   # checked at two lengths


def test_quick_report_matches_its_section_of_the_results_doc(quick):
    """docs/results/ktier.md holds what `reproduce ktier --quick` prints, verbatim: a changed result or a
    hand-edited number fails here."""
    from pathlib import Path

    from tierserve.experiments.results_doc import read_section
    doc = Path(__file__).resolve().parents[1] / "docs" / "results" / "ktier.md"
    assert (read_section(doc, "ktier quick") or "").strip() == (quick / "ktier_report.md").read_text().strip()


def test_quick_capacity_table_has_every_class_and_a_consistent_search(quick):
    rows = _csv(quick / "ktier_capacity.csv")
    base = next(r for r in rows if r["stack"].startswith("fcfs") and r["arrival"] == "poisson")
    # the capacity is bracketed by a failing probe within the stated tolerance, and that failure has a reason
    cap, top, tol = float(base["capacity_rps"]), float(base["fails_at_rps"]), float(base["rel_tol"])
    assert cap < top <= cap * (1 + tol) + 1e-9 and base["fails_above"] != ""
    low, high = (int(x) for x in base["runs"].split("–"))
    assert 400 <= low <= high <= 1600                                 # the lengths the verdicts chose
    for r in rows:
        cap = float(r["capacity_rps"])
        if math.isnan(cap):         # even the bracket's bottom failed (reported as such); nothing to compare
            continue
        classes = [float(r[f"{c}_rps"]) for c in CLASS_NAMES]
        assert all(x > 0 for x in classes), r["stack"]
        assert cap <= min(classes) + 1e-9 and cap <= float(r["stable_only_rps"]) + 1e-9
        if float(r["fails_at_rps"]) < math.inf:
            assert float(r["fails_at_rps"]) <= cap * (1 + float(r["rel_tol"])) + 1e-9, r["stack"]
    assert {"llumnix_10pct (K=2)", "llumnix_50pct (K=2)"} <= {r["stack"] for r in rows}


def test_quick_load_sweep_is_stable_below_capacity_and_unstable_above(quick):
    rows = [r for r in _csv(quick / "ktier_rho.csv") if r["arrival"] == "poisson"]
    fcfs = {float(r["rho"]): r for r in rows if r["stack"].startswith("fcfs")}
    low, high = min(fcfs), max(fcfs)
    assert low < 1 < high
    assert fcfs[low]["verdict"].startswith("stable") and fcfs[high]["verdict"].startswith("unstable")
    assert float(fcfs[high]["all_attainment"]) < float(fcfs[low]["all_attainment"])
    assert all(r["all_attainment_ci95"] != "" for r in rows)          # intervals over ≥ 3 seeds


def test_quick_overload_rows_carry_isolation_and_recovery(quick):
    rows = _csv(quick / "ktier_overload.csv")
    assert {r["stack"].split(" ")[0] for r in rows} == {"fcfs", "local_prio", "llumnix_k"}
    for r in rows:
        assert 0.0 <= float(r["c0_burst_attainment"]) <= 1.0
        for c in range(1, NUM_CLASSES):
            lost = int(r[f"c{c}_not_recovered"])
            # a recovery time for every class, unless some seed never recovered (then it is counted instead)
            assert (r[f"c{c}_recovery_s"] != "") == (lost == 0)
            if lost == 0:
                assert float(r[f"c{c}_recovery_s"]) >= 0.0


def test_quick_gpus_needed_is_the_smallest_passing_count_and_grows_at_most_linearly(quick):
    for r in _csv(quick / "ktier_gpus.csv"):
        for side in ("low", "high"):
            rate = float(r[f"rate_{side}_rps"])
            checks = {int(n): ok == "pass" for at, n, ok in re.findall(r"([\d.]+) req/s N=(\d+): (pass|fail)",
                                                                      r["checked"]) if abs(float(at) / rate - 1) < 0.01}
            n = float(r[f"gpus_{side}"])
            assert math.isfinite(n) and checks[int(n)], r
            assert int(n) == 1 or checks.get(int(n) - 1) is False, r
        assert float(r["gpus_high"]) <= 2 * float(r["gpus_low"]) + 1 and r["linear"] == "yes", r


def test_sensitivity_rows_halve_and_double_the_migration_link_and_swap_the_architecture():
    from tierserve.experiments.ktier import Study
    study = Study(sensitivity=True, sensitivity_axes=("model", "bandwidth"))
    v = study.variants()
    bw = study.setup.bandwidth_gbytes_s
    assert sorted(s.bandwidth_gbytes_s for s in v.values()) == sorted([bw, bw, bw / 2, bw * 2])
    assert {s.model for s in v.values()} == {study.setup.model, "Llama-3-8B"}
    for name, s in v.items():    # one change at a time: each row differs from the main setup in one field
        diff = [f for f in ("model", "bandwidth_gbytes_s", "token_budget", "exec_mode")
                if getattr(s, f) != getattr(study.setup, f)]
        assert len(diff) == (1 if name else 0), (name, diff)
    assert list(Study(sensitivity=False).variants()) == [""]
