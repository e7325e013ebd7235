"""tierserve.metrics.stability: the steady-state window, the queue-trend and backlog verdicts and 95% intervals
over seeds.

Synthetic sequences only (no simulator): the verdict on simulated stacks at ρ = 0.6 / 1.2 is in test_capacity.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from tierserve.core import Outcome
from tierserve.metrics import COLUMNS, RequestTable, summarize
from tierserve.metrics.stability import (
    BACKLOG, STABLE, UNKNOWN, UNSTABLE, WORK, aggregate, backlog_verdict, mean_ci95, run_stability, stability_verdict,
    steady_run, steady_state_mask, steady_state_summary, trend_test,
)


def table_of(arrival_s, ttft_s, tier=None, outcome=None, ttft_slo_s=math.nan) -> RequestTable:
    """A request table with the given arrivals and TTFTs (NaN: no first token); other columns neutral."""
    a = np.asarray(arrival_s, float)
    n = a.size
    t = np.asarray(ttft_s, float)
    oc = np.full(n, int(Outcome.FINISHED)) if outcome is None else np.asarray(outcome)
    cols = {c: np.zeros(n) for c in COLUMNS}
    cols.update(id=np.arange(n), tier=np.zeros(n, int) if tier is None else np.asarray(tier), app=[""] * n,
                reason=[""] * n, arrival_s=a, dispatch_s=a, first_token_s=a + t,
                finish_s=np.where(oc == Outcome.FINISHED, a + t + 1.0, np.nan), prompt_tokens=np.full(n, 10),
                output_tokens=np.full(n, 2), generated_tokens=np.where(oc == Outcome.FINISHED, 2, 0),
                outcome=oc, ttft_slo_s=np.full(n, ttft_slo_s), tbt_slo_s=np.full(n, np.nan),
                ttlt_slo_s=np.full(n, np.nan))
    return RequestTable(cols)


# ---- steady-state window ------------------------------------------------------------------------------
@pytest.mark.parametrize("n, fraction", [(1000, 0.1), (1234, 0.1), (999, 0.25), (37, 0.1), (50, 0.0), (7, 0.2)])
def test_steady_state_window_drops_exactly_the_stated_fraction_at_each_end(n, fraction):
    rng = np.random.default_rng(n)
    arrival = rng.permutation(np.arange(n, dtype=float))  # unsorted: the window is by arrival rank, not position
    keep = steady_state_mask(arrival, fraction)
    k = math.floor(fraction * n + 1e-9)
    assert keep.sum() == n - 2 * k
    assert (arrival[~keep] < k).sum() == k and (arrival[~keep] >= n - k).sum() == k  # k earliest, k latest
    assert np.all((arrival[keep] >= k) & (arrival[keep] < n - k))


def test_steady_state_window_with_tied_arrivals_still_drops_exact_counts():
    arrival = np.zeros(100)  # every request arrives at once: ranks follow position
    keep = steady_state_mask(arrival, 0.1)
    assert keep.sum() == 80 and not keep[:10].any() and not keep[90:].any()


def test_steady_state_mask_rejects_a_fraction_that_leaves_nothing():
    with pytest.raises(ValueError, match="drop_fraction"):
        steady_state_mask(np.arange(10.0), 0.5)


def test_steady_state_summary_counts_only_the_window_and_states_it():
    n = 200
    arrival = np.arange(n, dtype=float) * 0.5
    ttft = np.where(np.arange(n) < 20, 5.0, 0.1)  # the 20 warm-up requests are the slow ones
    table = table_of(arrival, ttft, ttft_slo_s=1.0)
    whole = summarize(table, None, 100.0)
    steady = steady_state_summary(table, drop_fraction=0.1)
    assert whole.all.total == 200 and steady.all.total == 160
    assert whole.all.slo_attainment == pytest.approx(0.9) and steady.all.slo_attainment == 1.0
    info = steady.extras["steady_state"]
    assert info["drop_fraction_each_end"] == 0.1 and info["kept"] == 160 and info["dropped"] == 40
    assert info["arrival_from_s"] == 10.0 and info["arrival_to_s"] == 89.5
    assert steady.duration_s == pytest.approx(79.5)  # rates are per second of the window's arrival span


# ---- trend test and verdict ---------------------------------------------------------------------------
def test_trend_test_both_ways():
    x = np.arange(10.0)
    p_up, slope_up = trend_test(x, 0.2 + 0.5 * x)
    p_down, slope_down = trend_test(x, 5.0 - 0.5 * x)
    assert p_up < 1e-5 and slope_up == pytest.approx(0.5)
    assert p_down > 0.99 and slope_down == pytest.approx(-0.5)
    assert trend_test(x, np.full(10, 0.3)) == (1.0, 0.0)


def test_verdict_on_a_growing_queue_is_unstable():
    rng = np.random.default_rng(1)
    arrival = np.sort(rng.uniform(0, 200, 2000))
    ttft = 0.1 + 0.2 * arrival + rng.exponential(0.2, arrival.size)  # backlog grows 0.2 s per s of arrivals
    v = stability_verdict(arrival, ttft)
    assert v.verdict == UNSTABLE and not v.stable
    assert v.slope == pytest.approx(0.2, abs=0.02) and v.ratio > 2 and v.p_value < 0.01
    assert len(v.window_medians_s) == 10 and v.n == 1600
    assert str(v).startswith("unstable: slope +0.2")


def test_verdict_on_a_stationary_queue_is_stable():
    rng = np.random.default_rng(2)
    arrival = np.sort(rng.uniform(0, 200, 2000))
    ttft = 0.1 + rng.exponential(0.3, arrival.size)  # heavy-ish noise, no trend
    v = stability_verdict(arrival, ttft)
    assert v.verdict == STABLE and v.stable
    assert abs(v.slope) < 0.005 and 0.5 < v.ratio < 2


def test_a_significant_but_tiny_trend_is_stable():
    arrival = np.linspace(0, 100, 1000)
    ttft = 0.1 + 0.0002 * arrival  # strictly increasing (p tiny) but only +0.016 s across the window
    v = stability_verdict(arrival, ttft)
    assert v.p_value < 1e-5 and v.growth_s < 0.5
    assert v.verdict == STABLE


def test_censored_requests_are_evidence_of_instability():
    arrival = np.linspace(0, 100, 1000)
    ttft = np.full(1000, 0.2)
    censored = np.zeros(1000, bool)
    censored[700:720] = True  # 2% of the window never got a first token before the run ended
    ttft[censored] = np.nan
    v = stability_verdict(arrival, ttft, censored, end_s=120.0)
    assert v.verdict == UNSTABLE and v.censored_fraction == pytest.approx(20 / 800)
    assert "never finished" in v.reason
    censored[:] = False
    censored[700:704] = True  # 0.5%: within the allowance, and the rest is flat
    ttft = np.full(1000, 0.2)
    ttft[censored] = np.nan
    assert stability_verdict(arrival, ttft, censored, end_s=120.0).verdict == STABLE


def test_too_few_requests_give_unknown_which_is_not_unstable():
    v = stability_verdict(np.arange(12.0), np.arange(12.0))
    assert v.verdict == UNKNOWN and v.stable


def test_run_stability_judges_each_tier_so_a_starving_tier_is_seen():
    rng = np.random.default_rng(3)
    n = 3000
    arrival = np.sort(rng.uniform(0, 300, n))
    tier = rng.choice([0, 1], size=n, p=[0.8, 0.2])
    ttft = np.where(tier == 0, 0.2 + rng.exponential(0.1, n), 0.2 + 0.3 * arrival)  # tier 1 starves
    table = table_of(arrival, ttft, tier=tier)
    verdicts = run_stability(table, end_s=400.0, tier_names=["gold", "bronze"])
    assert list(verdicts) == ["gold", "bronze", "all"]
    assert verdicts["gold"].verdict == STABLE and verdicts["bronze"].verdict == UNSTABLE
    assert verdicts["all"].verdict == STABLE  # the overall median hides it: why tiers are judged apart


def test_rejected_requests_are_left_out_of_the_verdict():
    arrival = np.linspace(0, 100, 1000)
    ttft = np.full(1000, 0.2)
    outcome = np.full(1000, int(Outcome.FINISHED))
    outcome[500:] = int(Outcome.REJECTED)  # never queued: no TTFT, not censored
    ttft[500:] = np.nan
    v = run_stability(table_of(arrival, ttft, outcome=outcome), end_s=100.0)["all"]
    assert v.verdict == STABLE and v.n == 400 and v.censored_fraction == 0.0


# ---- intervals over seeds -----------------------------------------------------------------------------
def test_mean_ci95_is_student_t_over_per_seed_values():
    iv = mean_ci95([1.0, 2.0, 3.0])
    t_975_2df = 4.302652729911275  # Student t 97.5% quantile, 2 degrees of freedom (tables)
    assert iv.mean == 2.0 and iv.n == 3
    assert iv.half_width == pytest.approx(t_975_2df * 1.0 / math.sqrt(3))
    assert iv.low < 2.0 < iv.high and str(iv).startswith("2 ± 2.5")
    one = mean_ci95([4.0, math.nan])
    assert one.n == 1 and one.mean == 4.0 and math.isnan(one.half_width)


def test_aggregate_gives_per_tier_intervals():
    rng = np.random.default_rng(4)
    summaries = []
    for seed in range(3):
        arrival = np.arange(100.0)
        table = table_of(arrival, 0.1 * (seed + 1) + rng.uniform(0, 0.01, 100), tier=np.arange(100) % 2)
        summaries.append(summarize(table, None, 100.0))
    out = aggregate(summaries, ["ttft.p50", "slo_attainment"])
    assert set(out) == {"tier0", "tier1", "all"}
    assert out["all"]["ttft.p50"].mean == pytest.approx(0.205, abs=0.01) and out["all"]["ttft.p50"].n == 3
    assert out["tier0"]["slo_attainment"].mean == 1.0 and out["tier0"]["slo_attainment"].half_width == 0.0


# ---- the backlog verdict ------------------------------------------------------------------------------
def fifo_table(rate: float, service_rate: float, n: int = 2000, seed: int = 0) -> RequestTable:
    """One FIFO server (Lindley's recursion): TTFT = wait + service, finish one second after the first token."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1 / rate, n))
    service = rng.exponential(1 / service_rate, n)
    wait = np.zeros(n)
    for i in range(1, n):
        wait[i] = max(0.0, wait[i - 1] + service[i - 1] - (arrival[i] - arrival[i - 1]))
    return table_of(arrival, wait + service)


def test_backlog_verdict_sees_a_deadline_scheduler_serving_relaxed_requests_after_the_arrivals_end():
    """One third interactive, served at once; two thirds with long deadlines, served earliest deadline first only
    after the last arrival (a run shorter than their targets): TTFT never rises along arrival order, so every
    queue-trend verdict is stable, but the number of unfinished requests climbs all through the window."""
    rng = np.random.default_rng(4)
    n = 3000
    arrival = np.sort(rng.uniform(0, 300, n))
    tier = np.arange(n) % 3
    deadline = arrival + np.array([6.0, 600.0, 1800.0])[tier]
    ttft = 0.2 + rng.exponential(0.1, n)
    relaxed = np.flatnonzero(tier > 0)
    by_deadline = relaxed[np.argsort(deadline[relaxed], kind="stable")]
    served_at = 300.0 + np.arange(1, relaxed.size + 1) * 0.2     # after the arrivals, in deadline order
    ttft[by_deadline] = served_at - arrival[by_deadline]
    table = table_of(arrival, ttft, tier=tier)
    trend = run_stability(table, end_s=1000.0, tier_names=["Q1", "Q2", "Q3"])
    assert all(v.verdict == STABLE for v in trend.values())       # the queue-trend rule is fooled
    v = backlog_verdict(table)
    assert v.verdict == UNSTABLE and v.measure == BACKLOG and v.ratio == pytest.approx(2 / 3, abs=0.02)
    run = steady_run(table, 1000.0, ["Q1", "Q2", "Q3"], seed=0)
    assert run.stability[WORK].verdict == UNSTABLE and not run.stable and run.verdict_line() == UNSTABLE
    assert str(v).startswith("unstable: backlog")


@pytest.mark.parametrize("seed", range(5))
def test_backlog_verdict_keeps_a_stable_queue_near_its_knee_stable(seed):
    table = fifo_table(rate=0.9, service_rate=1.0, seed=seed)      # ρ = 0.9: a wandering but stable backlog
    assert backlog_verdict(table).verdict == STABLE
    assert steady_run(table, float(table.arrival_s.max()), None, seed).stable


def test_backlog_verdict_on_an_overloaded_fifo_queue_agrees_with_the_trend_rule():
    table = fifo_table(rate=1.3, service_rate=1.0)
    assert backlog_verdict(table).verdict == UNSTABLE
    assert run_stability(table, float(table.arrival_s.max()))["all"].verdict == UNSTABLE


def test_backlog_verdict_needs_enough_requests_and_leaves_rejected_out():
    assert backlog_verdict(fifo_table(1.3, 1.0, n=30)).verdict == UNKNOWN
    table = fifo_table(rate=0.9, service_rate=1.0, n=2000)
    oc = np.full(2000, int(Outcome.FINISHED))
    oc[1000:] = int(Outcome.REJECTED)                              # never queued: not a backlog
    t = table_of(table.arrival_s, table.ttft_s, outcome=oc)
    v = backlog_verdict(t)
    assert v.n == 800 and v.verdict == STABLE


# ---- the work verdict -----------------------------------------------------------------------------------
def test_unfinished_work_matches_a_request_by_request_count():
    rng = np.random.default_rng(7)
    n = 60
    arrival = np.sort(rng.uniform(0, 50, n))
    first = arrival + rng.exponential(2.0, n)
    finish = first + rng.exponential(5.0, n)
    first[5], finish[5] = np.nan, np.nan                  # never started
    finish[9] = np.nan                                     # never finished: its decode never progresses
    finish[11] = first[11]                                 # a one-token decode: done at its first token
    prefill, decode = rng.integers(1, 500, n).astype(float), rng.integers(1, 300, n).astype(float)
    at = np.linspace(0, 70, 57)
    from tierserve.metrics.stability import unfinished_work
    got = unfinished_work(at, arrival, first, finish, prefill, decode)
    want = np.zeros(at.size)
    for k, t in enumerate(at):
        for i in range(n):
            if arrival[i] > t:
                continue
            left = prefill[i] if not (first[i] <= t) else 0.0          # NaN compares False: still to do
            if np.isnan(finish[i]) or not (first[i] <= t):
                left += decode[i]
            elif t < finish[i]:
                left += decode[i] * (finish[i] - t) / (finish[i] - first[i])
            want[k] += left
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-6)


def test_mser_finds_a_planted_warm_up_and_not_a_fixed_fraction():
    from tierserve.metrics.stability import mser_cut
    rng = np.random.default_rng(3)
    for ramp in (10, 40, 80):
        series = np.concatenate([np.linspace(0, 100, ramp), 100 + rng.normal(0, 3, 200 - ramp)])
        assert ramp - 5 <= mser_cut(series) <= ramp + 12, ramp
    assert mser_cut(100 + rng.normal(0, 3, 200)) < 20            # no warm-up: (almost) nothing dropped


def test_sequential_verdict_lengthens_only_while_undecided_and_stops_at_the_bound():
    from tierserve.metrics.stability import UNDECIDED, WorkVerdict, sequential_verdict
    asked: list[int] = []

    def run_at(n: int) -> int:
        asked.append(n)
        return n

    def verdict(n: int) -> WorkVerdict:
        return WorkVerdict(STABLE if n >= 4000 else UNDECIDED, num_requests=n)
    _, v = sequential_verdict(run_at, 1000, 16000, verdict)
    assert asked == [1000, 2000, 4000] and v.verdict == STABLE and v.lengths == (1000, 2000, 4000)
    asked.clear()
    _, v = sequential_verdict(run_at, 1000, 3000, lambda n: WorkVerdict(UNDECIDED, num_requests=n))
    assert asked == [1000, 2000, 3000] and v.verdict == UNDECIDED and not v.stable


@pytest.mark.parametrize("queue", ["M/M/2", "M/G/4 batch 8"])
def test_work_verdict_has_no_errors_far_from_capacity_under_every_order(queue):
    """A small version of benchmarks/stability_verdict.py: analytic queues at ρ = 0.8 and 1.2 under FCFS,
    priority, EDF and SRPF, five seeds each, sequential lengths 2,000 → 8,000."""
    from tierserve.experiments.queues import ORDERS, error_rates
    for order in ORDERS:
        low, high = error_rates(queue, order, 0.8, 5, 2000, 8000), error_rates(queue, order, 1.2, 5, 2000, 8000)
        assert low.stable == 5 and high.unstable == 5, (order, low, high)
        assert max(low.lengths) <= 8000 and min(high.lengths) == 2000


def test_work_verdict_reads_the_same_overload_under_edf_and_srpf():
    """The backlog of *requests* depends on the order (SRPF leaves few, long ones); the work does not."""
    from tierserve.experiments.queues import simulate_queue
    runs = {order: simulate_queue(1.2, 4000, 0, order) for order in ("edf", "srpf")}
    left = {o: int(((r.finish_s > r.arrival_s.max())).sum()) for o, r in runs.items()}
    assert left["srpf"] < 0.5 * left["edf"]                    # far fewer requests waiting under SRPF ...
    edf, srpf = (r.verdict() for r in runs.values())
    assert edf.verdict == srpf.verdict == UNSTABLE             # ... but the same work piling up
    assert edf.growth == pytest.approx(srpf.growth, abs=0.01)
