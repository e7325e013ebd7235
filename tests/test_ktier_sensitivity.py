"""`tierserve reproduce ktier --sensitivity`: the sensitivity rows on their own — which stacks each axis repeats,
how a row is compared with the main setup, and the quick run checked against its section of the results doc."""
from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.core import ConfigError
from tierserve.experiments.ktier import POISSON, CapacityRow, RunSetup, Study, ladder_stacks
from tierserve.experiments.ktier_sensitivity import _jobs, check_axes, comparisons, markdown
from tierserve.experiments.results_doc import read_section

DOC = Path(__file__).resolve().parents[1] / "docs" / "results" / "ktier.md"


def _labels(jobs):
    return sorted((j["group"], j["stack"].label, j["setup"].bandwidth_gbytes_s, j["setup"].model) for j in jobs)


def test_bandwidth_rows_repeat_the_migrating_stacks_at_both_links_and_the_main_one():
    study = Study(sensitivity=True, sensitivity_axes=("bandwidth",))
    base, rest = _jobs(study)
    assert _labels(base) == [("main setup", "fcfs", 1.0, "Llama-2-7B")]
    assert _labels(rest) == sorted([("main setup", "+migration", 1.0, "Llama-2-7B"),
                                    ("main setup", "llumnix_k", 1.0, "Llama-2-7B")]
                                   + [(f"sensitivity migration {b:g} GB/s (×{x})", m, b, "Llama-2-7B")
                                      for b, x in ((0.5, "0.5"), (2.0, "2")) for m in ("+migration", "llumnix_k")])
    base, rest = _jobs(replace(study, sensitivity_axes=("model",)))      # a replica change: its own baseline
    assert _labels(base) == [("sensitivity Llama-3-8B (GQA)", "fcfs", 1.0, "Llama-3-8B")]
    assert {j["stack"].label for j in rest} == {"local_prio", "llumnix_k"}
    with pytest.raises(ConfigError, match="sensitivity_axes"):
        check_axes(("bandwidth", "colour"))


def _row(group, label, bw, rate, fails_at, live=0.0, above=0.0):
    st = {s.label: s for s in ladder_stacks(4)}[label]
    return CapacityRow(group=group, stack=st, setup=RunSetup(bandwidth_gbytes_s=bw), arrival=POISSON, rate=rate,
                       saturated=False, stable_rate=rate, class_rates={}, class_saturated={}, seeds=(0, 1, 2),
                       rel_tol=0.05, lo=1.0, hi=30.0, probes=5, verdict_at_capacity="stable", fails_above="",
                       wall_s=0.0, migrations_live=live, fails_at=fails_at, migrations_live_above=above)


def test_a_row_is_compared_with_its_stack_on_the_main_setup_and_zero_migrations_are_flagged():
    main = _row("main setup", "+migration", 1.0, 20.0, 21.0, live=5.0)
    same = _row("sensitivity migration 0.5 GB/s (×0.5)", "+migration", 0.5, 20.5, 21.5, live=6.0, above=9.0)
    apart = _row("sensitivity migration 2 GB/s (×2)", "+migration", 2.0, 23.0, 24.0, live=6.0)
    lines = comparisons([main, same, apart])
    assert len(lines) == 2 and "overlap — no measured difference" in lines[0] and "DO NOT overlap" in lines[1]
    assert "6 live migrations per run at its capacity, 9 at 21.5 req/s" in lines[0]
    study = Study(sensitivity=True, sensitivity_axes=("bandwidth",))
    quiet = [replace(r, migrations_live=0.0, migrations_live_above=0.0) for r in (main, same, apart)]
    assert "No live migration happened" in markdown(study, quiet, [])
    assert "No live migration happened" not in markdown(study, [main, same, apart], [])


def test_quick_sensitivity_matches_its_section_of_the_results_doc(tmp_path):
    """docs/results/ktier.md's 'ktier quick-sensitivity' is what `reproduce ktier --quick --sensitivity` prints."""
    res = CliRunner().invoke(app, ["reproduce", "ktier", "--quick", "--sensitivity", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "ktier_report.md").read_text()
    with open(tmp_path / "ktier_capacity.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["stack"].split(" ")[0] for r in rows) == ["fcfs", "llumnix_k", "local_prio"]
    assert all("Llama-3-8B" in r["setup"] and math.isfinite(float(r["capacity_rps"])) for r in rows)
    fcfs = next(r for r in rows if r["stack"].startswith("fcfs"))
    assert float(fcfs["fails_at_rps"]) > float(fcfs["capacity_rps"])     # bracketed by a failing probe
    for r in rows:                 # ×baseline is against the variant's own fcfs (not the main setup's)
        assert math.isclose(float(r["capacity_x_baseline"]), float(r["capacity_rps"]) / float(fcfs["capacity_rps"]))
    assert (read_section(DOC, "ktier quick-sensitivity") or "").strip() == md.strip()
