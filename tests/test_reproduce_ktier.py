"""A tiny smoke run of `tierserve reproduce ktier` (the full sweep is a command, not a test)."""
from __future__ import annotations

import csv

from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.experiments.ktier import SEED_TABLE, KTierSetup, run_ktier, table_rows


def test_tiny_ktier_sweep_writes_the_seed_table(tmp_path):
    setup = KTierSetup(ks=(1, 3), mixes=("uniform",), scales=(200,), num_replicas=2, references=("sarathi",))
    result = run_ktier(setup, tmp_path, executor="serial", progress=False)
    rows = list(csv.DictReader(open(tmp_path / "ktier_table.csv")))
    systems = {(r["system"], r["K"]) for r in rows}
    assert {("baseline", "3"), ("sarathi", "3"), ("llumnix_k", "1"), ("llumnix_k", "3"), ("adaptive", "3")} <= systems
    base = next(r for r in rows if r["system"] == "baseline")
    assert float(base["prefill_mean_x"]) == 1.0                  # speedups are relative to INFaaS+vLLM
    k3 = next(r for r in rows if r["system"] == "llumnix_k" and r["K"] == "3")
    assert "seed_prefill_mean_x" in k3           # the seed's column sits beside ours (filled at 10k/15k)
    assert all(int(r["finished"]) + int(r["censored"]) + int(r["rejected"]) == 200 for r in rows)
    assert "cost/latency gain = 1 −" in result["markdown"]
    assert (tmp_path / "ktier_table.md").exists() and result["plots"]


def test_reproduce_ktier_command_is_registered():
    out = CliRunner().invoke(app, ["reproduce", "ktier", "--help"])
    assert out.exit_code == 0 and "--quick" in out.output


def test_seed_numbers_are_placed_beside_the_matching_rows():
    from tierserve.experiments.ktier import RunRow
    assert SEED_TABLE[(10000, 4)] == (4.87, 8.23, 3.13, 2.88, 0.68)     # seed 000's headline row
    fields = {f: 0 for f in RunRow.__dataclass_fields__}
    common = dict(fields, mix="uniform", scale=10000, local_policy="x", cluster_policy="y", finished=1,
                  ttft_mean=1.0, ttft_p99=1.0, e2e_mean=1.0, e2e_p99=1.0, makespan_s=1.0, gpu_s=1.0,
                  tier_ttft_p50=[], tier_ttft_p99=[], tier_slo_attainment=[], ttft=[], tier=[])
    rows = [RunRow(**dict(common, system="baseline", k=3)), RunRow(**dict(common, system="llumnix_k", k=4))]
    table = table_rows(rows)
    k4 = next(r for r in table if r["system"] == "llumnix_k")
    assert k4["seed_prefill_mean_x"] == 8.23 and k4["prefill_mean_x"] == 1.0
