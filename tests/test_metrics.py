"""tierserve.metrics: per-request records, weighted quantiles, summaries, output files, capacity search."""
from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest

from tierserve.core import SLO, Request, RequestState, Status, Tier, TierSet
from tierserve.core import Outcome
from tierserve.metrics import (
    RequestTable, RunSummary, TokenTBT, capacity_search, latency_stats, load_outputs, summarize,
    weighted_quantile, write_outputs,
)


def mk(rid: int, tier: int, arrival: float, *, first: float = -1.0, finish: float = -1.0, prompt: int = 10,
       output: int = 5, generated: int = 0, status: Status = Status.FINISHED, slo: SLO = SLO(),
       tbt_max: float = 0.0, app: str = "chat") -> RequestState:
    """A RequestState with its fields set directly, as the simulator leaves them at the end of a run."""
    s = RequestState(Request(rid, arrival, prompt, output, tier, slo, app))
    s.first_token_s, s.finish_s, s.num_generated, s.status, s.tbt_max_s = first, finish, generated, status, tbt_max
    s.dispatch_s = arrival if status != Status.REJECTED else -1.0
    s.replica = 0 if status != Status.REJECTED else -1
    return s


INTERACTIVE = SLO(ttft_s=1.0, tbt_s=0.6)
BATCH = SLO(ttlt_s=1.0)


def scenario() -> tuple[list[RequestState], dict[int, str]]:
    states = [
        # tier 0: meets (TTFT 0.5, TPOT 2.0/4 = 0.5) though its worst gap 0.9 exceeds the TBT target
        mk(0, 0, 0.0, first=0.5, finish=2.5, output=5, generated=5, slo=INTERACTIVE, tbt_max=0.9),
        # tier 0: TTFT 2.0 > 1.0 misses
        mk(1, 0, 1.0, first=3.0, finish=4.0, output=3, generated=3, slo=INTERACTIVE, tbt_max=0.5),
        # tier 0: rejected
        mk(2, 0, 1.5, output=4, status=Status.REJECTED, slo=INTERACTIVE),
        # tier 1: censored (still running), had 2 tokens
        mk(3, 1, 2.0, first=2.2, output=9, generated=2, status=Status.RUNNING, slo=BATCH, tbt_max=0.1),
        # tier 1: one output token, no targets: meets, TPOT undefined
        mk(4, 1, 0.0, first=0.1, finish=0.1, output=1, generated=1),
        # tier 1: TTLT 1.5 > 1.0 misses
        mk(5, 1, 0.0, first=0.2, finish=1.5, output=2, generated=2, slo=BATCH, tbt_max=1.3),
    ]
    return states, {2: "prompt larger than KV capacity", 3: "time limit"}


@pytest.fixture
def table() -> RequestTable:
    return RequestTable.from_states(*scenario())


def test_columns_from_states(table: RequestTable) -> None:
    assert len(table) == 6
    assert table.id.tolist() == [0, 1, 2, 3, 4, 5]
    assert table.outcome.tolist() == [Outcome.FINISHED, Outcome.FINISHED, Outcome.REJECTED, Outcome.CENSORED,
                                      Outcome.FINISHED, Outcome.FINISHED]
    assert table.reason.tolist() == ["", "", "prompt larger than KV capacity", "time limit", "", ""]
    assert np.isnan(table.finish_s[2]) and np.isnan(table.first_token_s[2]) and np.isnan(table.dispatch_s[2])
    assert table.ttft_slo_s[0] == 1.0 and np.isnan(table.ttlt_slo_s[0]) and table.ttlt_slo_s[5] == 1.0
    assert table.app[0] == "chat" and table.generated_tokens[3] == 2


def test_derived_latencies(table: RequestTable) -> None:
    np.testing.assert_allclose(table.ttft_s, [0.5, 2.0, np.nan, 0.2, 0.1, 0.2], equal_nan=True)
    np.testing.assert_allclose(table.ttlt_s, [2.5, 3.0, np.nan, np.nan, 0.1, 1.5], equal_nan=True)
    np.testing.assert_allclose(table.e2e_s, table.ttlt_s, equal_nan=True)
    np.testing.assert_allclose(table.tpot_s, [0.5, 0.5, np.nan, np.nan, np.nan, 1.3], equal_nan=True)
    np.testing.assert_allclose(table.normalized_latency_s, [0.5, 1.0, np.nan, np.nan, 0.1, 0.75], equal_nan=True)


def test_slo_checks(table: RequestTable) -> None:
    assert table.meets_slo.tolist() == [True, False, False, False, True, False]
    # the worst-gap criterion is stricter: request 0's 0.9 s gap breaks its 0.6 s TBT target
    assert table.meets_tbt_max.tolist() == [False, True, False, False, True, True]
    assert table.meets_slo_strict.tolist() == [False, False, False, False, True, False]


def test_select_and_for_tier(table: RequestTable) -> None:
    t1 = table.for_tier(1)
    assert t1.id.tolist() == [3, 4, 5]
    assert table.select(np.array([5, 0])).id.tolist() == [5, 0]
    assert table.tiers == [0, 1]


def test_weighted_quantile_matches_expanded_inverted_cdf() -> None:
    rng = np.random.default_rng(7)
    values = rng.exponential(0.05, 300)
    weights = rng.integers(1, 20, 300)
    expanded = np.repeat(values, weights)
    pcts = [0, 1, 7, 25, 29, 50, 57, 90, 95, 99, 99.9, 100]
    got = weighted_quantile(values, weights, np.array(pcts) / 100.0)
    want = np.percentile(expanded, pcts, method="inverted_cdf")
    np.testing.assert_array_equal(got, want)
    # hand case: 3 tokens at 0.1, 1 token at 0.5 -> p50 = 0.1, p75 = 0.1, p76 = 0.5
    assert weighted_quantile([0.5, 0.1], [1, 3], 0.5) == 0.1
    assert weighted_quantile([0.5, 0.1], [1, 3], 0.75) == 0.1
    assert weighted_quantile([0.5, 0.1], [1, 3], 0.76) == 0.5
    assert math.isnan(weighted_quantile([], [], 0.5))


def test_token_tbt_per_tier() -> None:
    tbt = TokenTBT([0.02, 0.04, 0.5, 0.03], [0, 0, 1, 1], [3, 1, 2, 2])
    t0 = tbt.for_tier(0)
    assert t0.num_tokens == 4 and t0.mean() == pytest.approx((0.06 + 0.04) / 4)
    assert t0.quantile(0.5) == 0.02 and t0.quantile(0.99) == 0.04
    s1 = tbt.for_tier(1).stats()
    assert s1.n == 4 and s1.p50 == 0.03 and s1.p99 == 0.5 and s1.max == 0.5


def test_summarize_counts_attainment_goodput_throughput(table: RequestTable) -> None:
    tbt = TokenTBT([0.5, 0.5, 0.1, 1.3], [0, 0, 1, 1], [4, 2, 1, 1])
    s = summarize(table, tbt, duration_s=10.0, extras={"migrations": 3})
    assert list(s.tiers) == ["tier0", "tier1", "all"]
    t0, t1, a = s["tier0"], s[1], s.all
    assert (t0.total, t0.finished, t0.rejected, t0.censored) == (3, 2, 1, 0)
    assert (t1.total, t1.finished, t1.rejected, t1.censored) == (3, 2, 0, 1)
    assert (a.total, a.finished, a.rejected, a.censored) == (6, 4, 1, 1)
    # rejected and censored count as misses
    assert t0.slo_attainment == pytest.approx(1 / 3) and t1.slo_attainment == pytest.approx(1 / 3)
    assert a.slo_attainment == pytest.approx(2 / 6) and a.slo_met == 2
    assert t0.goodput_rps == pytest.approx(0.1) and a.goodput_rps == pytest.approx(0.2)
    assert a.throughput_rps == pytest.approx(0.4)
    assert a.output_tokens_per_s == pytest.approx((5 + 3 + 1 + 2) / 10)
    assert a.total_tokens_per_s == pytest.approx((11 + 40) / 10)
    assert a.generated_tokens_per_s == pytest.approx(13 / 10)  # censored request's 2 tokens included
    # latencies over finished requests only
    assert t0.ttft.n == 2 and t0.ttft.mean == pytest.approx(1.25) and t0.ttft.max == 2.0
    assert t0.ttlt.p50 == pytest.approx(2.75)
    assert t1.ttft.n == 2 and t1.ttft.p50 == pytest.approx(0.15)  # censored request 3's TTFT excluded
    assert t1.tpot.n == 1 and t1.tpot.max == pytest.approx(1.3)   # request 4 has no TPOT
    assert t0.tbt.n == 6 and t0.tbt.p50 == 0.5 and a.tbt.n == 8
    assert s.extras == {"migrations": 3}
    assert s.tiers["all"].get("ttft.p50") == a.ttft.p50 and s.all.get("e2e.max") == 3.0


def test_summarize_names_goals_and_empty_tiers(table: RequestTable) -> None:
    ts = TierSet([Tier(0, "premium", SLO(ttft_s=1.0, attainment=0.3)), Tier(1, "standard"),
                  Tier(2, "free", SLO(ttft_s=5.0, attainment=0.9))])
    s = summarize(table, None, 10.0, tier_names=ts)
    assert list(s.tiers) == ["premium", "standard", "free", "all"]
    assert s["premium"].attainment_goal == 0.3 and s["premium"].meets_goal
    assert s["standard"].attainment_goal == 0.99 and not s["standard"].meets_goal
    free = s["free"]
    assert free.total == 0 and math.isnan(free.slo_attainment) and math.isnan(free.ttft.p99)
    assert s.all.tbt.n == 0 and math.isnan(s.all.tbt.p50)


def test_summary_json_has_no_nan(table: RequestTable) -> None:
    s = summarize(table, TokenTBT.empty(), 10.0, ["a", "b", "c"], extras={"kv": np.float64("nan"), "n": np.int64(2)})
    text = json.dumps(s.to_dict(), allow_nan=False)  # raises on NaN
    assert "NaN" not in text
    back = RunSummary.from_dict(json.loads(text))
    assert math.isnan(back["c"].slo_attainment) and back["a"].slo_attainment == pytest.approx(1 / 3)
    assert back["a"].ttft == s["a"].ttft
    rows = s.to_rows()
    assert [r["name"] for r in rows] == ["a", "b", "c", "all"] and "ttft_p99" in rows[0]


def test_csv_round_trip_exact(tmp_path, table: RequestTable) -> None:
    # awkward text and floats that do not print short
    states, reasons = scenario()
    states.append(mk(6, 2, 0.1 + 0.2, first=1 / 3, finish=math.pi, generated=5, app='a,"b"\nc', tbt_max=1e-17))
    reasons[6] = "x, y"
    t = RequestTable.from_states(states, reasons)
    p = t.to_csv(tmp_path / "r.csv")
    back = RequestTable.from_csv(p)
    assert back.equals(t)
    for name, col in t.columns.items():
        assert back[name].dtype == col.dtype, name
    assert RequestTable.from_csv(RequestTable.empty().to_csv(tmp_path / "e.csv")).equals(RequestTable.empty())


def test_write_and_load_outputs(tmp_path, table: RequestTable) -> None:
    s = summarize(table, None, 10.0)
    paths = write_outputs(tmp_path / "run", table, s, {"policy": "edf", "rate": 2.5, "path": tmp_path})
    assert sorted(p.name for p in paths.values()) == ["requests.csv", "summary.json", "summary_by_tier.csv"]
    out = load_outputs(tmp_path / "run")
    assert out.table.equals(table)
    assert out.config["policy"] == "edf" and out.config["path"] == str(tmp_path)
    assert out.summary.all.slo_attainment == s.all.slo_attainment
    assert (tmp_path / "run" / "summary_by_tier.csv").read_text().count("\n") == 4  # header + 2 tiers + all


def test_pickle_round_trip(table: RequestTable) -> None:
    s = summarize(table, None, 10.0)
    assert pickle.loads(pickle.dumps(table)).equals(table)
    assert pickle.loads(pickle.dumps(s)).all.slo_met == s.all.slo_met


def test_latency_stats_plain_percentile() -> None:
    st = latency_stats([4.0, 1.0, 3.0, 2.0, np.nan])
    assert st.n == 4 and st.p50 == 2.5 and st.max == 4.0 and st.mean == 2.5
    assert st.p99 == pytest.approx(np.percentile([1, 2, 3, 4], 99))


def _synthetic(threshold: float):
    calls: list[float] = []

    def run(rate: float) -> RunSummary:
        calls.append(rate)
        n = 100
        ok = n if rate <= threshold else int(n * 0.5)  # monotone: attainment drops past the threshold
        states = [mk(i, 0, 0.0, first=0.1, finish=0.2 if i < ok else 9.0, generated=5, slo=BATCH) for i in range(n)]
        return summarize(RequestTable.from_states(states, {}), None, 10.0)
    return run, calls


def test_capacity_search_finds_threshold() -> None:
    run, calls = _synthetic(3.7)
    res = capacity_search(run, lo=0.5, hi=10.0, target_attainment=0.99, tol=0.01)
    assert res.feasible and not res.saturated
    assert 3.7 - 0.01 <= res.rate <= 3.7
    assert [p.rate for p in res.probes] == calls and res.probes[0].ok and not res.probes[1].ok
    assert all(p.ok == (p.rate <= 3.7) for p in res.probes)


def test_capacity_search_edges() -> None:
    run, _ = _synthetic(3.7)
    low = capacity_search(run, lo=5.0, hi=10.0, tol=0.1)
    assert not low.feasible and len(low.probes) == 1
    high = capacity_search(run, lo=1.0, hi=2.0, tol=0.1)
    assert high.saturated and high.rate == 2.0
    with pytest.raises(ValueError):
        capacity_search(run, lo=2.0, hi=1.0)


def test_from_states_summarises_100k_rows_consistently() -> None:
    # Speed is measured in benchmarks/, not here (the machines are noisy); this pins the large-table results.
    n = 100_000
    rng = np.random.default_rng(0)
    arr = rng.uniform(0, 100, n)
    states = [mk(i, i % 3, float(arr[i]), first=float(arr[i]) + 0.2, finish=float(arr[i]) + 2.0, generated=5,
                 slo=INTERACTIVE) for i in range(n)]
    table = RequestTable.from_states(states, {})
    s = summarize(table, TokenTBT(rng.uniform(0, 0.1, n), rng.integers(0, 3, n), rng.integers(1, 5, n)), 100.0)
    assert s.all.total == n and sum(s.tiers[f"tier{t}"].total for t in range(3)) == n
    assert np.allclose(table.ttft_s, 0.2) and np.allclose(table.ttlt_s, 2.0)
