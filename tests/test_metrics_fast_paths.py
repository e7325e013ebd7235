"""The metrics' fast paths give exactly what the plain code gives: `RequestTable.to_csv` (columns written once
per distinct value, constant columns joined once) is byte-equal to the csv module's output, `from_states` equals
the row-by-row construction."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tierserve.core import SLO, Outcome, Request, RequestState, Status, request_of
from tierserve.metrics.records import COLUMNS, RequestTable
from tierserve.core.paths import shared_data
from tierserve.metrics.stats import latency_stats
from tierserve.workload.lengths import DATASETS
from test_sim_output_bytes import csv_module_bytes


def make_table(n: int, rng: np.random.Generator, constant: set[str], kind: str) -> RequestTable:
    """Columns in `constant` hold one value; the others vary as `kind` says."""
    cols = {}
    for name, dtype in COLUMNS.items():
        if dtype is object:
            cols[name] = ["same" if name in constant else f"t{j % 3}" for j in range(n)]
        elif dtype is np.float64:
            if name in constant:
                cols[name] = np.full(n, -0.0 if kind == "neg_zero" else 2.5)
            elif kind == "repeats":        # few distinct values, with 0.0/-0.0 and two NaN payloads among them
                pool = np.array([0.0, -0.0, 1.5, 1e-7, 3.0e20, np.nan,
                                 np.frombuffer(np.int64(0x7FF8000000000001).tobytes(), np.float64)[0]])
                cols[name] = pool[rng.integers(0, pool.size, size=n)]
            else:
                cols[name] = rng.normal(size=n) * 10.0 ** rng.integers(-9, 9, size=n)
        else:
            lo, hi = (-3, 5) if kind == "repeats" else (-(10**9), 10**9)
            cols[name] = np.full(n, 7) if name in constant else rng.integers(lo, hi, size=n)
    return RequestTable(cols)


LAYOUTS = {
    "none": set(),
    "start": {"id", "tier", "app"},
    "middle": {"preemptions", "swaps", "migrations", "replica", "outcome", "reason", "relegated_s"},
    "end": {"ttft_slo_s", "tbt_slo_s", "ttlt_slo_s"},
    "start_middle_end": {"id", "tier", "preemptions", "swaps", "tbt_max_s", "ttft_slo_s", "tbt_slo_s",
                         "ttlt_slo_s"},
    "all_but_one": set(COLUMNS) - {"finish_s"},
    "all": set(COLUMNS),
}


@pytest.mark.parametrize("n", [1, 2, 300, 3000])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("kind", ["repeats", "distinct", "neg_zero"])
def test_to_csv_equals_csv_module(tmp_path, n, layout, kind):
    table = make_table(n, np.random.default_rng(n), LAYOUTS[layout], kind)
    assert table.to_csv(tmp_path / "ours.csv").read_bytes() == csv_module_bytes(table, tmp_path / "csv.csv")


def test_to_csv_identical_columns_and_repeated_floats_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    table = make_table(2000, rng, set(), "repeats")
    cols = table.columns
    cols["output_tokens"] = cols["generated_tokens"] = rng.integers(1, 4000, size=2000)
    cols["dispatch_s"] = cols["arrival_s"]
    table = RequestTable(cols)
    path = table.to_csv(tmp_path / "ours.csv")
    assert path.read_bytes() == csv_module_bytes(table, tmp_path / "csv.csv")
    back = RequestTable.from_csv(path)
    assert back.equals(table)
    # -0.0 and 0.0 are different texts; a merge of the two would show here
    assert (np.signbit(back["tbt_max_s"]) == np.signbit(table["tbt_max_s"])).all()


def reference_from_states(states, reasons):
    """The row-by-row construction `from_states` replaced."""
    nan = math.nan
    reqs = [request_of(s) for s in states]
    stamp = lambda x: x if x >= 0 else nan  # noqa: E731

    def outcome(s):
        if s.status == Status.FINISHED:
            return int(Outcome.RELEGATED) if s.relegated_s >= 0 else int(Outcome.FINISHED)
        return int(Outcome.REJECTED) if s.status == Status.REJECTED else int(Outcome.CENSORED)
    return RequestTable({
        "id": [r.id for r in reqs], "tier": [r.tier for r in reqs], "app": [r.app for r in reqs],
        "arrival_s": [r.arrival_s for r in reqs], "dispatch_s": [stamp(s.dispatch_s) for s in states],
        "first_token_s": [stamp(s.first_token_s) for s in states], "finish_s": [stamp(s.finish_s) for s in states],
        "prompt_tokens": [r.prompt_tokens for r in reqs], "output_tokens": [r.output_tokens for r in reqs],
        "generated_tokens": [s.num_generated for s in states], "preemptions": [s.num_preemptions for s in states],
        "swaps": [s.num_swaps for s in states], "migrations": [s.num_migrations for s in states],
        "replica": [s.replica for s in states], "outcome": [outcome(s) for s in states],
        "reason": [reasons.get(s.id) or s.relegation_reason for s in states],
        "relegated_s": [stamp(s.relegated_s) for s in states], "tbt_max_s": [s.tbt_max_s for s in states],
        "ttft_slo_s": [nan if (x := r.slo.ttft_s) is None else float(x) for r in reqs],
        "tbt_slo_s": [nan if (x := r.slo.tbt_s) is None else float(x) for r in reqs],
        "ttlt_slo_s": [nan if (x := r.slo.ttlt_s) is None else float(x) for r in reqs],
    })


def hand_made_states() -> list[RequestState]:
    """Every outcome: finished, relegated, rejected, censored (waiting, running, swapped), with and without SLOs."""
    slo = SLO(ttft_s=0.5, tbt_s=0.1, ttlt_s=None)
    out = []
    for i, (status, relegated_s) in enumerate([(Status.FINISHED, -1.0), (Status.FINISHED, 3.0),
                                                (Status.FINISHED, 0.0), (Status.REJECTED, -1.0),
                                                (Status.WAITING, -1.0), (Status.RUNNING, 2.0),
                                                (Status.SWAPPED, -1.0), (Status.MIGRATING, -1.0)]):
        s = RequestState(Request(i, 0.25 * i, 10 + i, 5, tier=i % 3, slo=slo if i % 2 else SLO(), app=f"a{i % 2}"))
        s.status, s.relegated_s = status, relegated_s
        s.relegation_reason = "late" if relegated_s >= 0 else ""
        if status == Status.FINISHED:
            s.dispatch_s, s.first_token_s, s.finish_s, s.num_generated = 0.25 * i, 1.0 + i, 2.0 + i, 5
        elif status != Status.REJECTED:
            s.dispatch_s = -0.0 if i == 4 else 0.5      # -0.0 >= 0: kept, not NaN
        s.tbt_max_s = 0.01 * i
        s.num_preemptions, s.replica = i % 2, i % 4
        out.append(s)
    return out


@pytest.mark.parametrize("reasons", [{}, {3: "too long", 4: "", 6: "still swapped"}])
def test_from_states_equals_row_by_row(tmp_path, reasons):
    states = hand_made_states()
    ours, ref = RequestTable.from_states(states, reasons), reference_from_states(states, reasons)
    assert ours.equals(ref)
    for name in COLUMNS:            # and the same bits (equals() lets NaN match NaN and 0.0 match -0.0)
        if COLUMNS[name] is not object:
            assert ours[name].tobytes() == ref[name].tobytes(), name
    assert ours.to_csv(tmp_path / "a.csv").read_bytes() == ref.to_csv(tmp_path / "b.csv").read_bytes()


@pytest.mark.skipif(shared_data(*DATASETS["azure2023_conv"][0]) is None,
                    reason="../shared/data absent: the empirical azure2023_conv lengths skipped")
def test_from_states_of_a_run_equals_row_by_row():
    from tierserve.sim import ClusterConfig, simulate
    from tierserve.workload import WorkloadConfig, build_workload
    wl = build_workload(WorkloadConfig.from_dict({
        "num_requests": 400, "seed": 5, "arrivals": {"kind": "poisson", "rate": 30.0},
        "lengths": {"kind": "empirical", "dataset": "azure2023_conv", "max_total_tokens": 4096},
        "tiers": {"num_tiers": 3, "mix": "uniform"}}))
    # a small KV (preemptions, a rejection) and a time limit (censored requests)
    cfg = ClusterConfig(num_replicas=2, local_policy="vllm", cluster_policy="round_robin", time_limit_s=8.0,
                        replica={"num_blocks": 200})
    sim = simulate(cfg, wl.requests, num_tiers=3)
    ours, ref = RequestTable.from_states(sim.states, sim.reasons), reference_from_states(sim.states, sim.reasons)
    outcomes = set(ours["outcome"].tolist())
    assert {int(Outcome.FINISHED), int(Outcome.CENSORED)} <= outcomes
    for name in COLUMNS:
        assert ours[name].tolist() == ref[name].tolist() if COLUMNS[name] is object \
            else ours[name].tobytes() == ref[name].tobytes(), name


def test_latency_stats_leaves_its_input_alone():
    v = np.random.default_rng(2).random(101)
    before = v.copy()
    s = latency_stats(v)
    assert v.tobytes() == before.tobytes()
    assert (s.p50, s.p99) == tuple(float(x) for x in np.percentile(before, [50, 99]))
    assert s.mean == float(before.mean())
