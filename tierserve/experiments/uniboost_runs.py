"""One UniBoost-study run (`tierserve.experiments.uniboost`): the setups, the requests, the simulation and
the numbers each run reports."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tierserve.core import ConfigError, Request, Status, true_output_tokens
from tierserve.metrics import RequestTable
from tierserve.metrics.stability import SteadyRun, steady_run
from tierserve.workload.mixes import reasoning_chat_lengths, short_long_lengths
from tierserve.workload.tiers import default_tier_set

TABLE2_POLICIES = ("fcfs", "sjf", "las", "srpt", "distboost", "uniboost_base", "uniboost_memguard", "uniboost")
SECTIONS = ("table2", "starvation", "dispatch", "replay", "gamma", "fig7", "sensitivity", "tiers")
ABLATION = ("las", "distboost", "uniboost_base", "uniboost_memguard", "uniboost")
# Seed 001's reported numbers we can check (ALGORITHMS.md §3; the seed's tables carry no other values here).
SEED_HEADLINE = {"uniboost.ttlt.p99": 35.0, "uniboost.ttft.p95": 97.0}
SEED_SLO_GAIN = (2.9, 8.7)
SEED_FIG7 = "knee moves right by 4-6%; UniBoost P99 sub-second at the highest QPS where others are multi-second"
METRICS = ("ttft.p50", "ttft.p95", "ttft.p99", "ttlt.p50", "ttlt.p95", "ttlt.p99", "tpot.p50", "tpot.p95",
           "tpot.p99", "tokens_per_s")


@dataclass(frozen=True)
class Setup:
    """One cluster + workload shape; the rate is set per point."""

    name: str = "table2"
    model: str = "Llama-3-8B"
    gpu: str = "A100-80GB"
    num_replicas: int = 1
    cluster_policy: str = "round_robin"
    num_requests: int = 1200
    workload: str = "mix"               # mix (70% reasoning + 30% chat) | starvation (90% short + 10% long)
    reasoning_fraction: float = 0.7
    num_tiers: int = 1
    token_budget: int | None = None     # None: the policy's default (2,048 for the new policies)
    max_total: int = 8192
    # Simulated time stops `drain_s` after the last arrival; requests still in flight are censored and the run is
    # judged unstable (a queue that cannot drain in 15 min is not stable, and thrashing runs stay bounded).
    drain_s: float = 900.0
    arrivals: str = "poisson"           # poisson | azure_conv (the Azure 2023 conversation trace's gaps, bursty)
    # Rate multipliers over equal consecutive shares of the requests (piecewise-constant load); () = constant.
    rate_profile: tuple[float, ...] = ()
    # Trace replay (seed 001 A.5): the cluster trace of `replay_of` replicas is dispatched at random and only
    # replica `replay_replica`'s share is simulated (alone; random dispatch makes the replicas independent).
    # num_requests is then per replica; 0 = simulate the whole cluster of num_replicas.
    replay_of: int = 0
    replay_replica: int = 0
    record_gamma: bool = False          # keep γ (and γ-Ada's load estimate) at every completion in the run's row



# ---- one run ------------------------------------------------------------------------------------------------
ARRIVALS = ("poisson", "azure_conv")


def _unit_gaps(setup: Setup, n: int, rng: np.random.Generator) -> np.ndarray:
    """n inter-arrival gaps of mean 1: exponential, or the Azure conversation trace's gaps from a random start,
    repeated end to end as often as needed."""
    if setup.arrivals == "poisson":
        return rng.exponential(1.0, n)
    if setup.arrivals != "azure_conv":
        raise ConfigError("arrivals", setup.arrivals, " | ".join(ARRIVALS))
    gaps = _trace_gaps()
    start = int(rng.integers(len(gaps)))
    reps = -(-(start + n) // len(gaps))
    return np.tile(gaps, reps)[start:start + n]


_TRACE_GAPS: np.ndarray | None = None            # read once per process: every replay job needs the same gaps


def _trace_gaps() -> np.ndarray:
    global _TRACE_GAPS
    if _TRACE_GAPS is None:
        from tierserve.core.paths import shared_data
        path = shared_data("traces", "azure2023_conv.csv")
        if path is None:
            raise ConfigError("arrivals", "azure_conv", "shared/data/traces/azure2023_conv.csv present (not found)")
        t = np.loadtxt(path, delimiter=",", skiprows=1, usecols=0)
        gaps = np.diff(np.sort(t))
        _TRACE_GAPS = gaps / gaps.mean()
    return _TRACE_GAPS


def _check_setup(setup: Setup) -> None:
    if not (isinstance(setup.replay_of, int) and setup.replay_of >= 0):
        raise ConfigError("replay_of", setup.replay_of, "an integer >= 0 (replicas of the replayed cluster; 0 = off)")
    if setup.replay_of and not 0 <= setup.replay_replica < setup.replay_of:
        raise ConfigError("replay_replica", setup.replay_replica,
                          f"a replica index in [0, replay_of = {setup.replay_of})")
    if setup.replay_of and setup.num_replicas != 1:
        raise ConfigError("num_replicas", setup.num_replicas, "1 when replaying one replica's share (replay_of > 0)")
    if any(not (math.isfinite(m) and m > 0) for m in setup.rate_profile):
        raise ConfigError("rate_profile", setup.rate_profile, "positive finite rate multipliers")


def mixed_requests(setup: Setup, rate: float, seed: int) -> list[Request]:
    """The setup's requests at `rate` (req/s, the whole cluster's): the same sizes at every rate (unit gaps scaled
    by 1/rate; with a rate profile, request i's gap by 1/(rate·profile[segment of i])). When replaying
    (`replay_of` > 0) the cluster's trace holds num_requests × replay_of requests, each sent to a replica drawn
    uniformly at random, and only replica `replay_replica`'s share is returned (ids stay the cluster's)."""
    _check_setup(setup)
    ss = np.random.SeedSequence([seed, 1])
    r_arr, r_len, r_tier, r_disp = (np.random.default_rng(c) for c in ss.spawn(4))
    n = setup.num_requests * max(setup.replay_of, 1)
    gaps = _unit_gaps(setup, n, r_arr)
    if setup.rate_profile:
        prof = np.asarray(setup.rate_profile, float)
        gaps = gaps / prof[np.arange(n) * len(prof) // n]
    times = np.cumsum(gaps) / rate
    if setup.workload == "starvation":
        lens = short_long_lengths(n, r_len)
    else:
        lens = reasoning_chat_lengths(n, r_len, setup.reasoning_fraction, setup.max_total)
    tier_set = default_tier_set(setup.num_tiers)
    if setup.num_tiers > 1:
        from tierserve.workload.tiers import assign_tiers, enterprise_mix
        tiers = assign_tiers(n, enterprise_mix(setup.num_tiers), r_tier)
    else:
        tiers = np.zeros(n, np.int64)
    keep = (np.flatnonzero(r_disp.integers(0, setup.replay_of, n) == setup.replay_replica).tolist()
            if setup.replay_of else range(n))     # Python ints: a request id is an int, not a numpy scalar
    return [Request(i, float(times[i]), int(lens.prompts[i]), int(lens.outputs[i]), int(tiers[i]),
                    tier_set[int(tiers[i])].slo, "long" if lens.reasoning[i] else "short") for i in keep]


def _cluster(setup: Setup, policy: str, params: dict, cluster_policy: str | None = None,
             time_limit_s: float | None = None):
    from tierserve.sim import ClusterConfig
    replica: dict[str, Any] = {"model": setup.model, "gpu": setup.gpu}
    if setup.token_budget:
        replica["token_budget"] = setup.token_budget
    return ClusterConfig(num_replicas=setup.num_replicas, local_policy=policy, local_policy_params=dict(params),
                         cluster_policy=cluster_policy or setup.cluster_policy, replica=replica,
                         time_limit_s=time_limit_s)


def with_preempt_mode(policy: str, params: dict, mode: str) -> dict:
    """`params` with `preempt_mode` = `mode` where the policy takes one and the row does not set its own
    (UniBoost with MemGuard picks the cheaper of swap and recompute itself and ignores it)."""
    import inspect

    from tierserve.core import PreemptMode
    from tierserve.policies.local import LOCAL_POLICIES
    cls = LOCAL_POLICIES.get_class(policy)
    takes = PreemptMode.SWAP in cls.preempt_modes and any(
        "preempt_mode" in inspect.signature(k.__init__).parameters for k in cls.__mro__ if "__init__" in vars(k))
    return {**params, "preempt_mode": params.get("preempt_mode", mode)} if takes else dict(params)


def simulate_point(policy: str, params: dict, setup: Setup, rate: float, seed: int, mode: str = "recompute"):
    from tierserve.sim import simulate
    params = with_preempt_mode(policy, params, mode)
    reqs = mixed_requests(setup, rate, seed)
    limit = reqs[-1].arrival_s + setup.drain_s if setup.drain_s else None
    res = simulate(_cluster(setup, policy, params, time_limit_s=limit), reqs, setup.num_tiers, seed=seed)
    table = RequestTable.from_states(res.states, res.reasons)
    run = steady_run(table, res.duration_s, default_tier_set(setup.num_tiers), seed, rate)
    return res, table, run


@dataclass(frozen=True)
class PointRunner:
    """`make_run(rate, seed[, num_requests]) -> SteadyRun` for `find_capacity` (picklable)."""

    policy: str
    params: tuple = ()
    setup: Setup = Setup()
    mode: str = "recompute"

    def __call__(self, rate: float, seed: int, num_requests: int | None = None) -> SteadyRun:
        su = self.setup if num_requests is None else replace(self.setup, num_requests=int(num_requests))
        return simulate_point(self.policy, dict(self.params), su, rate, seed, self.mode)[2]


def _unloaded_latency(states, predictor) -> tuple[np.ndarray, np.ndarray]:
    """Per request: TTFT and TTLT alone on an idle replica (the prompt as one chunk, then its decodes)."""
    ttft0, ttlt0 = [], []
    for s in states:
        p, o = s.prompt_tokens, true_output_tokens(s)
        t1 = predictor.iteration_time(p, p * p * 0.5, 0, 0)
        dec = (o - 1) * (predictor.decode_base_time(1) + predictor.decode_context_coef_s * (p + o / 2))
        ttft0.append(t1)
        ttlt0.append(t1 + dec)
    return np.asarray(ttft0), np.asarray(ttlt0)


def grown_point(policy: str, params: dict, setup: Setup, rate: float, seed: int, mode: str = "recompute",
                most: int | None = None):
    """`simulate_point` at the setup's length, or — with `most` above it — at the length the work verdict chooses:
    doubled while undecided, up to `most` requests (still undecided there, the run says so). Returns
    (result, table, run, lengths tried); the run's work verdict lists the lengths too."""
    if not most or most <= setup.num_requests:
        res, table, run = simulate_point(policy, params, setup, rate, seed, mode)
        return res, table, run, (setup.num_requests,)
    from tierserve.metrics.stability import WORK, sequential_verdict
    (res, table, run), verdict = sequential_verdict(
        lambda n: simulate_point(policy, params, replace(setup, num_requests=n), rate, seed, mode),
        setup.num_requests, most, lambda point: point[2].stability[WORK])
    run.stability[WORK] = verdict
    return res, table, run, verdict.lengths


def run_point(policy: str, params: dict, setup: dict, rate: float, seed: int, mode: str = "recompute",
              most: int | None = None) -> dict[str, Any]:
    """One run's numbers (steady-state window): latency percentiles, throughput, verdict, preemption counts,
    SLO-scale P99s, and, for the starvation workload, the long-request trend and preempted-time P99. With `most`,
    the run length is the verdict's choice (`grown_point`): `requests` is the length chosen, `lengths` every one
    tried, `run_most` the bound."""
    st = Setup(**setup)
    t0 = time.perf_counter()
    res, table, run, lengths = grown_point(policy, params, st, rate, seed, mode, most)
    st = replace(st, num_requests=lengths[-1])
    allsum = run.summary.tiers["all"]
    out: dict[str, Any] = {"policy": policy, "params": params, "setup": st.name, "rate": rate, "seed": seed,
                           "replica": st.replay_replica, "requests": len(res.states),
                           "lengths": [int(x) for x in lengths], "run_most": most,
                           "stable": run.stable, "verdict": run.verdict_line(), "wall_s": 0.0,
                           "preempt_mode": with_preempt_mode(policy, params, mode).get("preempt_mode", "policy's own"),
                           "swaps": int(np.sum(table["swaps"]))}
    for m in METRICS[:-1]:
        out[m] = allsum.get(m)
    out["ttlt.p90"] = allsum.get("ttlt.p90")
    out["ttft.p90"] = allsum.get("ttft.p90")
    out["tokens_per_s"] = allsum.output_tokens_per_s
    out["censored"] = allsum.censored
    window = table.arrival_s >= (run.work.warmup_s if math.isfinite(run.work.warmup_s) else -math.inf)
    states = [s for s, keep in zip(res.states, window) if keep and s.status == Status.FINISHED]
    out["preemptions"] = sum(s.num_preemptions for s in states)
    out["forced_preemptions"] = sum(s.policy_data.get("forced_preemptions", 0) for s in states)
    out["priority_preemptions"] = sum(s.policy_data.get("priority_preemptions", 0) for s in states)
    from tierserve.hardware.exec_model import make_execution_model
    pred = make_execution_model(st.model, st.gpu, 1)
    f0, l0 = _unloaded_latency(states, pred)
    ttft = np.array([s.first_token_s - s.arrival_s for s in states])
    ttlt = np.array([s.finish_s - s.arrival_s for s in states])
    if len(states):
        out["ttft_scale99"] = float(np.percentile(ttft / f0, 99))     # tightest SLO scale met by 99%
        out["ttlt_scale99"] = float(np.percentile(ttlt / l0, 99))
    if st.num_tiers > 1:
        for t in range(st.num_tiers):
            tier = [s for s in states if s.tier == t]
            tt = np.array([s.first_token_s - s.arrival_s for s in tier])
            slo = default_tier_set(st.num_tiers)[t].slo
            out[f"tier{t}.ttft.p99"] = float(np.percentile(tt, 99)) if len(tt) else math.nan
            met = [s for s in tier if (slo.ttft_s is None or s.first_token_s - s.arrival_s <= slo.ttft_s)
                   and (slo.ttlt_s is None or s.finish_s - s.arrival_s <= slo.ttlt_s)]
            out[f"tier{t}.attainment"] = len(met) / len(tier) if tier else math.nan
    if st.workload == "starvation":
        out.update(starvation_numbers(res.states, window, rate))
    if st.record_gamma:
        out.update(gamma_numbers(st, res.states, rate, seed))
    out["wall_s"] = time.perf_counter() - t0
    return out


def long_request_trend(arrival_s: np.ndarray, e2e_s: np.ndarray, cluster_rate: float) -> dict[str, float]:
    """Least-squares slope of long-request E2E latency against arrival time, with its 95% interval, in s per
    request of the cluster's arrival order (slope per second of arrivals / the cluster's rate, so a replayed
    replica reads like the whole cluster's request ids) and as the growth over the fitted arrival span."""
    x, y = np.asarray(arrival_s, float), np.asarray(e2e_s, float)
    if len(x) < 3 or np.ptp(x) <= 0:
        return {}
    xc = x - x.mean()
    b = float(xc @ (y - y.mean()) / (xc @ xc))
    resid = y - y.mean() - b * xc
    se = math.sqrt(float(resid @ resid) / (len(x) - 2) / float(xc @ xc))
    from scipy.stats import t as student_t
    hw = float(student_t.ppf(0.975, len(x) - 2)) * se
    return {"long_slope_s_per_req": b / cluster_rate, "long_slope_hw_s_per_req": hw / cluster_rate,
            "long_growth_s": b * float(np.ptp(x)), "long_growth_hw_s": hw * float(np.ptp(x)),
            "long_fit_n": len(x), "arrival_span_s": float(np.ptp(x))}


def starvation_numbers(all_states, window, cluster_rate: float) -> dict[str, Any]:
    """A.3's per-class numbers over the steady-state window: short/long E2E percentiles, the long-request trend
    (finished ones), how many long requests did not finish, and the P99 of the time long requests spent
    preempted."""
    out: dict[str, Any] = {}
    kept = [s for s, k in zip(all_states, window) if k]
    longs = [s for s in kept if s.app == "long" and s.status == Status.FINISHED]
    shorts = [s for s in kept if s.app == "short" and s.status == Status.FINISHED]
    out["long_unfinished"] = sum(1 for s in kept if s.app == "long" and s.status != Status.FINISHED)
    out["long_finished"] = len(longs)
    if len(longs) >= 3:
        e2e = np.array([s.finish_s - s.arrival_s for s in longs])
        out.update(long_request_trend(np.array([s.arrival_s for s in longs]), e2e, cluster_rate))
        out["long_e2e.p50"], out["long_e2e.p99"] = (float(x) for x in np.percentile(e2e, [50, 99]))
        out["long_preempted_s.p99"] = float(np.percentile([s.policy_data.get("preempted_s", 0.0) for s in longs], 99))
    if shorts:
        e2e = np.array([s.finish_s - s.arrival_s for s in shorts])
        out["short_e2e.p50"], out["short_e2e.p99"] = (float(x) for x in np.percentile(e2e, [50, 99]))
    return out


def gamma_numbers(st: Setup, all_states, rate: float, seed: int) -> dict[str, Any]:
    """γ over the run (one point per completion: time, γ, γ-Ada's load estimate λ·E[S]) and, per load segment
    of the rate profile (by arrival), the median γ at completion, the median load estimate and the tails."""
    fin = sorted((s for s in all_states if s.status == Status.FINISHED), key=lambda s: s.finish_s)
    out: dict[str, Any] = {"gamma_trace": [[round(s.finish_s, 3), s.policy_data.get("gamma", math.nan),
                                            s.policy_data.get("gamma_load", math.nan)] for s in fin]}
    k = len(st.rate_profile) or 1
    by_arrival = sorted(all_states, key=lambda s: s.id)
    n = len(by_arrival)
    starts = [by_arrival[j * n // k].arrival_s for j in range(k)] + [math.inf]
    out["segment_starts_s"] = starts[:-1]
    for j in range(k):
        seg = [s for s in fin if starts[j] <= s.arrival_s < starts[j + 1]]
        done_in = [s for s in fin if starts[j] <= s.finish_s < starts[j + 1]]
        g = [s.policy_data.get("gamma", math.nan) for s in done_in]
        ld = [v for s in done_in if math.isfinite(v := s.policy_data.get("gamma_load", math.nan))]
        out[f"seg{j}.gamma.p50"] = float(np.median(g)) if g else math.nan
        out[f"seg{j}.load.p50"] = float(np.median(ld)) if ld else math.nan
        if seg:
            out[f"seg{j}.ttft.p95"] = float(np.percentile([s.first_token_s - s.arrival_s for s in seg], 95))
            out[f"seg{j}.ttlt.p99"] = float(np.percentile([s.finish_s - s.arrival_s for s in seg], 99))
    return out


