"""Seed 001 (UniBoost) reproduced on tierserve's replica model, in units of measured capacity.

Every point is a (policy, setup, ρ, seed) run judged in steady state (⌊0.1·n⌋ first and last arrivals dropped)
with the queue-trend stability verdict; points are reported as mean ± 95% over ≥ 3 seeds, with the share of
seeds whose queue was stable. ρ = rate / the stable-only capacity of `fcfs` (Sarathi order) on the same setup,
found by `find_capacity` (bisection, common random numbers across rates).

Sections (seed 001's numbering): Table 2 (Llama-3-8B, 70% reasoning + 30% Azure conversation, every policy as %
change vs `srpt`), §4.4 (tightest SLO scale at 99% attainment: P99 of latency / the request's unloaded latency),
Fig. 7 (CodeLlama-34B TP1, memory-bound: P90/P99 TTFT and TTLT vs ρ per ablation phase), A.3 (starvation:
90% short + 10% long, ρ ≈ 0.99, 8 replicas with random dispatch, replayed one replica at a time, ~1,260 s of
arrivals per replica), Tables 6–8 (k, δ, chunk, on the Fig. 7 setup), Table 9 (random / round-robin /
JSQ dispatch on 64 memory-bound replicas, vs `vllm`), Table 10 (32…512 replicas by trace replay: the cluster's
trace dispatched at random, a few replicas' shares simulated alone), γ-Ada over time under a stepped load, and
tiers (UniBoost's per-tier offset vs strict tier priority vs `vllm_priority`).

Capacities of all setups are searched together (one bisection step per setup per batch, so the pool stays
full). Runs then go in batches of a few points; after each batch one line per finished point is logged and the
runs, the report and the meta file are rewritten, marked PARTIAL until the last batch (INTERRUPTED if stopped).

API: Study (defaults = the full run; Study.quick()), run_study(study, outdir, executor, log) -> dict,
run_point(**job) -> dict (one run's numbers), mixed_requests(setup, rate, seed).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core import ConfigError, Request, Status, true_output_tokens
from tierserve.metrics import RequestTable
from tierserve.metrics.stability import SteadyRun, mean_ci95, steady_run, steady_state_mask
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


@dataclass(frozen=True)
class Study:
    """What to run. The defaults are the full study, ~40 min on 2 heavily shared cores (see the doc for why
    each size was chosen); `Study.quick()` is the smoke run."""

    seeds: tuple[int, ...] = (0, 1, 2)
    table2: Setup = Setup(num_requests=2000)
    table2_rhos: tuple[float, ...] = (0.7, 0.9, 1.0, 1.25)     # 1.25: where the KV cache fills
    table2_policies: tuple[str, ...] = TABLE2_POLICIES
    # at the loads other than table2_main_rho only these run (the headline's policies and the oracle baselines;
    # `las`, `distboost` and `uniboost_base` are unstable or dominated at 0.9 and cost the most time)
    table2_main_rho: float = 0.9
    table2_other_policies: tuple[str, ...] = ("fcfs", "sjf", "srpt", "uniboost_memguard", "uniboost")
    # Fig. 7: CodeLlama-34B on one A100-80GB leaves ~9 GB of KV (≈ 47k tokens): memory-bound, preemptions happen.
    fig7: Setup = Setup(name="fig7", model="CodeLlama-34B", num_requests=600)
    fig7_rhos: tuple[float, ...] = (0.8, 0.95, 1.1)
    # A.3 on 8 replicas with random dispatch, by replay: one replica's share per seed, simulated alone, ~4,000
    # requests (~1,260 s of arrivals at ρ = 0.99, 4–5× the long requests' E2E latency there). ρ is against
    # fcfs's stable-only capacity measured on these same long runs; the search starts from fcfs's saturation
    # throughput.
    starvation: Setup = Setup(name="starvation", workload="starvation", num_replicas=1, cluster_policy="random",
                              num_requests=4000, replay_of=8)
    starvation_rho: float = 0.99
    starvation_policies: tuple[str, ...] = ("fcfs", "sjf", "srpt", "las", "uniboost")
    saturation_requests: int = 2000          # backlog per probe run of the saturation throughput
    # Tables 6–8 run on the memory-bound Fig. 7 setup (k and δ only act when something is evicted); the default
    # variant (k = 256, δ = 32, chunk 2,048) is the Fig. 7 point at sens_rho, not rerun.
    sens_rho: float = 0.95
    ks: tuple[int, ...] = (64, 1024)
    deltas: tuple[int, ...] = (0, 256)
    chunks: tuple[int, ...] = (512, 1024)
    # Table 9 on 64 memory-bound replicas (the Fig. 7 replica: KV fills, so ordering and eviction matter).
    dispatch: Setup = Setup(name="dispatch", model="CodeLlama-34B", num_replicas=64, num_requests=64 * 200)
    dispatch_rho: float = 0.9
    # Table 10: replay of the Azure conversation trace's arrivals (rescaled to the cluster's rate) on 32…512
    # replicas with random dispatch; `replay_sampled` replicas of each cluster per seed are simulated.
    replay: Setup = Setup(name="replay", model="CodeLlama-34B", cluster_policy="random", num_requests=300,
                          arrivals="azure_conv", replay_of=32)
    replay_sizes: tuple[int, ...] = (32, 64, 128, 256, 512)
    replay_sampled: int = 2
    replay_rho: float = 0.8
    # γ-Ada trace: Table 2's replica and mix under a load that steps 0.4 → 0.8 → 1.1 → 0.4 of fcfs's capacity.
    gamma: Setup = Setup(name="gamma", num_requests=2400, rate_profile=(0.4, 0.8, 1.1, 0.4), record_gamma=True)
    tiers: Setup = Setup(name="tiers", num_tiers=3, num_requests=1500)
    tiers_rho: float = 0.9
    # run order = priority: an interrupted run leaves the headline first
    sections: tuple[str, ...] = ("replay", "dispatch", "gamma", "table2", "starvation", "fig7", "sensitivity",
                                 "tiers")
    capacity_rel_tol: float = 0.05
    batch_points: int = 4                    # points (all seeds of one configuration) per batch of runs

    @classmethod
    def quick(cls) -> Study:
        small = Setup(num_requests=240)
        return cls(table2=small, table2_rhos=(0.9,), sections=("table2", "starvation"),
                   starvation=Setup(name="starvation", workload="starvation", num_replicas=1,
                                    cluster_policy="random", num_requests=300, replay_of=8),
                   saturation_requests=300, capacity_rel_tol=0.1, batch_points=8)


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


def simulate_point(policy: str, params: dict, setup: Setup, rate: float, seed: int):
    from tierserve.sim import simulate
    reqs = mixed_requests(setup, rate, seed)
    limit = reqs[-1].arrival_s + setup.drain_s if setup.drain_s else None
    res = simulate(_cluster(setup, policy, params, time_limit_s=limit), reqs, setup.num_tiers, seed=seed)
    table = RequestTable.from_states(res.states, res.reasons)
    run = steady_run(table, res.duration_s, default_tier_set(setup.num_tiers), seed, rate)
    return res, table, run


@dataclass(frozen=True)
class PointRunner:
    """`make_run(rate, seed) -> SteadyRun` for `find_capacity` (picklable)."""

    policy: str
    params: tuple = ()
    setup: Setup = Setup()

    def __call__(self, rate: float, seed: int) -> SteadyRun:
        return simulate_point(self.policy, dict(self.params), self.setup, rate, seed)[2]


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


def run_point(policy: str, params: dict, setup: dict, rate: float, seed: int) -> dict[str, Any]:
    """One run's numbers (steady-state window): latency percentiles, throughput, verdict, preemption counts,
    SLO-scale P99s, and, for the starvation workload, the long-request trend and preempted-time P99."""
    st = Setup(**setup)
    t0 = time.perf_counter()
    res, table, run = simulate_point(policy, params, st, rate, seed)
    allsum = run.summary.tiers["all"]
    out: dict[str, Any] = {"policy": policy, "params": params, "setup": st.name, "rate": rate, "seed": seed,
                           "replica": st.replay_replica, "requests": len(res.states),
                           "stable": run.stable, "verdict": run.verdict_line(), "wall_s": 0.0}
    for m in METRICS[:-1]:
        out[m] = allsum.get(m)
    out["ttlt.p90"] = allsum.get("ttlt.p90")
    out["ttft.p90"] = allsum.get("ttft.p90")
    out["tokens_per_s"] = allsum.output_tokens_per_s
    out["censored"] = allsum.censored
    window = steady_state_mask(table.arrival_s)
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


# ---- the study --------------------------------------------------------------------------------------------
def _capacity_guess(setup: Setup) -> float:
    """A crude service-rate estimate (mean tokens at full-batch cost) to start the search from."""
    from tierserve.hardware.exec_model import make_execution_model
    reqs = mixed_requests(setup, 1.0, 0)
    pred = make_execution_model(setup.model, setup.gpu, 1)
    per_tok = pred.iteration_time(2048, 2048 * 1024, 0, 0) / 2048
    return (setup.replay_of or setup.num_replicas) / (per_tok * np.mean([r.prompt_tokens + r.output_tokens
                                                                         for r in reqs]))


def _cap_run(setup: dict, rate: float, seed: int) -> bool:
    return bool(PointRunner("fcfs", (), Setup(**setup))(rate, seed).stable)


def capacities(setups: list[Setup], seeds, rel_tol: float, executor: str, log=print,
               guesses: dict[str, float] | None = None) -> dict[str, dict]:
    """Stable-only capacity (req/s) of `fcfs` on each setup: the highest probed rate at which a majority of seeds
    is judged stable, to `rel_tol`. Geometric search from `guesses[name]` or `_capacity_guess` (doubling/halving
    until bracketed, then bisection); one probe per unfinished setup per batch, all seeds of all probes in one
    pool batch."""
    from tierserve.experiments.sweep import run_many
    guesses = guesses or {}
    state = {s.name: {"setup": s, "lo": None, "hi": None, "next": guesses.get(s.name) or _capacity_guess(s),
                      "probes": []} for s in setups}
    for rnd in range(1, 16):
        open_ = [st for st in state.values()
                 if not (st["lo"] and st["hi"] and st["hi"] / st["lo"] <= 1 + rel_tol)]
        if not open_:
            break
        jobs = [{"setup": asdict(st["setup"]), "rate": st["next"], "seed": sd} for st in open_ for sd in seeds]
        t0 = time.perf_counter()
        verdicts = run_many(_cap_run, jobs, executor=executor, progress=False, description="capacity probes")
        for i, st in enumerate(open_):
            v = verdicts[i * len(seeds):(i + 1) * len(seeds)]
            ok, rate = sum(v) * 2 > len(v), st["next"]
            st["probes"].append((rate, int(sum(v)), len(v)))
            if ok:
                st["lo"] = rate
                st["next"] = rate * 2 if st["hi"] is None else math.sqrt(rate * st["hi"])
            else:
                st["hi"] = rate
                st["next"] = rate / 2 if st["lo"] is None else math.sqrt(rate * st["lo"])
            log(f"[capacity {rnd}] {st['setup'].name}: {rate:.4g} req/s -> {int(sum(v))}/{len(v)} seeds stable; "
                f"bracket [{st['lo'] or 0:.4g}, {st['hi'] or math.inf:.4g}]  ({time.perf_counter() - t0:.0f} s)")
    return {name: {"rate": st["lo"] or math.nan, "probes": st["probes"],
                   "bracket": [st["lo"], st["hi"]]} for name, st in state.items()}


def _saturation_run(setup: dict, seed: int) -> float:
    """Completions per second of one backlogged `fcfs` replica: every request arrives within the first ~0.1% of
    the run; the rate is read between the 20th and the 80th percentile of finish times (no fill, no drain)."""
    from tierserve.sim import simulate
    st = Setup(**setup)
    reqs = mixed_requests(st, 1000.0 * _capacity_guess(st), seed)
    res = simulate(_cluster(st, "fcfs", {}), reqs, st.num_tiers, seed=seed)
    fin = np.sort([x.finish_s for x in res.states if x.status == Status.FINISHED])
    if len(fin) < 10:
        return math.nan
    i, j = int(0.2 * len(fin)), int(0.8 * len(fin))
    return (j - i) / (fin[j] - fin[i])


def saturation_capacity(setup: Setup, seeds, requests: int, executor: str, log=print) -> dict[str, Any]:
    """`fcfs`'s saturation throughput of one replica of `setup` (mean over seeds of `_saturation_run` with a
    backlog of `requests`), times `replay_of` (or num_replicas) for the cluster: the service rate when busy."""
    from tierserve.experiments.sweep import run_many
    one = replace(setup, num_replicas=1, replay_of=0, replay_replica=0, num_requests=requests, rate_profile=())
    t0 = time.perf_counter()
    per_seed = run_many(_saturation_run, [{"setup": asdict(one), "seed": sd} for sd in seeds], executor=executor,
                        progress=False, description="saturation runs")
    per_replica = float(np.mean(per_seed))
    size = setup.replay_of or setup.num_replicas
    log(f"[saturation] {setup.name}: fcfs serves {', '.join(f'{v:.4g}' for v in per_seed)} req/s per backlogged "
        f"replica (seeds {list(seeds)}); cluster of {size}: {size * per_replica:.4g} req/s  "
        f"({time.perf_counter() - t0:.0f} s)")
    return {"rate": size * per_replica, "per_replica_per_seed": [float(v) for v in per_seed], "requests": requests}


def replay_replicas(seed: int, cluster_size: int, sampled: int) -> list[int]:
    """The replicas of a `cluster_size` cluster whose shares are simulated for `seed` (distinct, seed-dependent)."""
    first = (seed * 101) % cluster_size
    step = cluster_size // max(sampled, 1) or 1
    return [(first + j * step) % cluster_size for j in range(min(sampled, cluster_size))]


def _jobs_for(study: Study, caps: dict[str, float]) -> list[dict[str, Any]]:
    """Every run, grouped by point, sections in `study.sections` order. `caps` gains the derived setups' bases."""
    jobs = []
    fig7_cap, t2_cap = caps.get(study.fig7.name), caps.get(study.table2.name)

    def add(section, policy, params, setup, rho, replicas=None):
        for s in study.seeds:
            for rep in (replicas(s) if replicas else [setup.replay_replica]):
                su = replace(setup, replay_replica=rep)
                jobs.append({"section": section, "policy": policy, "params": params, "setup": asdict(su),
                             "rate": rho * caps[setup.name], "seed": s, "rho": rho})
    for sec in study.sections:
        if sec == "table2":
            for rho in study.table2_rhos:
                for p in _table2_policies(study, rho):
                    add("table2", p, {}, study.table2, rho)
        elif sec == "fig7":
            for rho in study.fig7_rhos:
                for p in ("fcfs", *ABLATION):
                    add("fig7", p, {}, study.fig7, rho)
        elif sec == "sensitivity":
            for k in study.ks:
                add("sens_k", "uniboost", {"k": k}, study.fig7, study.sens_rho)
            for d in study.deltas:
                add("sens_delta", "uniboost", {"delta": d}, study.fig7, study.sens_rho)
            for c in study.chunks:
                su = replace(study.fig7, name=f"fig7_chunk{c}", token_budget=c)
                caps.setdefault(su.name, caps[study.fig7.name])
                for p in ("fcfs", "uniboost"):
                    add("sens_chunk", p, {}, su, study.sens_rho)
        elif sec == "starvation":
            su = study.starvation
            reps = (lambda sd: [sd % su.replay_of]) if su.replay_of else None
            for p in study.starvation_policies:
                add("starvation", p, {}, su, study.starvation_rho, reps)
        elif sec == "tiers":
            for p, params in (("vllm_priority", {}), ("uniboost", {"tier_mode": "strict"}),
                              ("uniboost", {"tier_mode": "offset"}), ("uniboost", {"tier_mode": "none"})):
                add("tiers", p, params, study.tiers, study.tiers_rho)
        elif sec == "dispatch":
            for cp in ("random", "round_robin", "jsq"):
                su = replace(study.dispatch, name=f"dispatch_{cp}", cluster_policy=cp)
                caps.setdefault(su.name, caps[study.dispatch.name])
                for p in ("vllm", "uniboost"):
                    add(f"dispatch_{cp}", p, {}, su, study.dispatch_rho)
        elif sec == "replay":
            for size in study.replay_sizes:
                su = replace(study.replay, name=f"replay{size}", replay_of=size, num_replicas=1)
                caps.setdefault(su.name, size * fig7_cap)
                for p in ("vllm", "uniboost"):
                    add("replay", p, {}, su, study.replay_rho,
                        lambda sd, size=size: replay_replicas(sd, size, study.replay_sampled))
        elif sec == "gamma":
            caps.setdefault(study.gamma.name, t2_cap)
            for p, params in (("uniboost", {}), ("uniboost", {"gamma_rule": "nudge"}), ("uniboost_memguard", {})):
                add("gamma", p, params, study.gamma, 1.0)
        else:
            raise ValueError(f"unknown section {sec!r}; known: table2, fig7, sensitivity, starvation, tiers, "
                             "dispatch, replay, gamma")
    return jobs


def _table2_policies(study: Study, rho: float) -> tuple[str, ...]:
    if rho == study.table2_main_rho:
        return study.table2_policies
    return tuple(p for p in study.table2_policies if p in study.table2_other_policies)


def _label(job: dict) -> str:
    p = job["params"]
    return job["policy"] + ("[" + ",".join(f"{k}={v}" for k, v in p.items()) + "]" if p else "")


def _setup_name(job: dict) -> str:
    return job["setup"]["name"]


def _point_key(job: dict) -> tuple:
    return (job["section"], _setup_name(job), _label(job), job["rho"])


def _capacity_setups(study: Study) -> tuple[list[Setup], dict[str, str]]:
    """Setups whose capacity is measured, and how the others derive theirs (name -> explanation)."""
    measured: dict[str, Setup] = {}
    derived: dict[str, str] = {}
    for sec in study.sections:
        if sec in ("table2", "tiers"):       # tiers: the same lengths and replica as Table 2 -> its capacity
            measured.setdefault(study.table2.name, study.table2)
        if sec in ("fig7", "sensitivity"):
            measured.setdefault(study.fig7.name, study.fig7)
        if sec == "starvation":
            measured.setdefault(study.starvation.name, study.starvation)
        if sec == "dispatch":               # num_replicas × the one-replica Fig. 7 capacity (not searched)
            measured.setdefault(study.fig7.name, study.fig7)
            derived[study.dispatch.name] = (f"{study.dispatch.num_replicas} × the one-replica `fcfs` capacity of "
                                            f"{study.fig7.name} (same replica and mix; not searched on "
                                            f"{study.dispatch.num_replicas} replicas)")
        if sec == "replay":
            measured.setdefault(study.fig7.name, study.fig7)
            derived["replay<N>"] = f"N × the one-replica `fcfs` capacity of {study.fig7.name} (Poisson arrivals)"
        if sec == "gamma":
            measured.setdefault(study.table2.name, study.table2)
            derived[study.gamma.name] = (f"the `fcfs` capacity of {study.table2.name} (same replica and mix); the "
                                         "rate profile multiplies it")
    if "tiers" in study.sections:
        derived[study.tiers.name] = f"the `fcfs` capacity of {study.table2.name} (same lengths and replica)"
    return list(measured.values()), derived


def _same_setup(old: dict | None, su: Setup, ignore: tuple[str, ...] = ()) -> bool:
    """`old` (a Setup as saved in a meta file, maybe from before some fields existed) equals `su`; a field the
    old file lacks counts as its default."""
    if old is None:
        return False
    norm = lambda v: json.loads(json.dumps(v, default=float))  # noqa: E731 (tuples saved as lists)
    return all(norm(old.get(f, Setup.__dataclass_fields__[f].default)) == norm(v)
               for f, v in asdict(su).items() if f not in ignore)


def run_study(study: Study, outdir: str | Path, executor: str = "process", log=print,
              reuse_meta: str | Path | None = None, resume: bool = False) -> dict[str, Any]:
    """Capacities, then every point in batches (see the module doc). `reuse_meta`: a previous run's
    uniboost_meta.json whose measured capacities (and probes) are taken instead of searching again — only for
    setups identical to this study's (same requests, model, replicas, workload); the others are searched.
    `resume`: keep the runs already in outdir's uniboost_runs.json that match a job of this study exactly (same
    policy, parameters, setup, rate and seed) and run only the rest."""
    from tierserve.core.errors import Interrupted
    from tierserve.experiments.sweep import run_many
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    to_measure, derived = _capacity_setups(study)
    old_meta = (json.loads((out / "uniboost_meta.json").read_text())
                if resume and (out / "uniboost_meta.json").exists() else None)
    meta: dict[str, Any] = {"status": "capacity search", "study": asdict(study), "capacities_rps": {},
                            "capacity_derived": derived}
    found: dict[str, dict] = {}
    if reuse_meta is not None:
        old = json.loads(Path(reuse_meta).read_text())
        old_setups = {v["name"]: v for v in old["study"].values() if isinstance(v, dict) and "name" in v}
        for su in list(to_measure):
            same = _same_setup(old_setups.get(su.name), su, ignore=("drain_s",))
            if same and su.name in old.get("capacity_probes", {}):
                found[su.name] = {"rate": old["capacities_rps"][su.name], "probes": old["capacity_probes"][su.name]}
                to_measure.remove(su)
                log(f"capacity of {su.name}: {found[su.name]['rate']:.4g} req/s, reused from {reuse_meta}")
        meta["capacity_reused_from"] = str(reuse_meta)
    _write_json(out / "uniboost_meta.json", meta)
    (out / "uniboost_report.md").write_text("# UniBoost (seed 001) on tierserve\n\n**PARTIAL: still searching "
                                            "capacities; no point has run yet.**\n")
    saturation: dict[str, Any] = {}
    su = study.starvation
    if "starvation" in study.sections and any(m.name == su.name for m in to_measure):
        # where the capacity search starts: fcfs's completion rate when backlogged (an under-estimate when
        # fcfs thrashes under a backlog, so the search doubles up from it)
        saturation[su.name] = saturation_capacity(su, study.seeds, study.saturation_requests, executor, log)
    elif reuse_meta is not None and su.name in found:     # the capacity came from there: so does its start point
        saturation.update(json.loads(Path(reuse_meta).read_text()).get("saturation", {}))
    meta["saturation"] = saturation
    if to_measure:
        log(f"capacity search for {', '.join(s.name for s in to_measure)} ({len(study.seeds)} seeds per probe)")
        found.update(capacities(to_measure, study.seeds, study.capacity_rel_tol, executor, log,
                                guesses={k: v["rate"] for k, v in saturation.items()}))
    caps = {k: v["rate"] for k, v in found.items()}
    if study.dispatch.name in derived:
        caps[study.dispatch.name] = study.dispatch.num_replicas * caps[study.fig7.name]
    if study.tiers.name in derived:
        caps[study.tiers.name] = caps[study.table2.name]
    cap_wall = time.perf_counter() - t0
    jobs = _jobs_for(study, caps)
    meta.update(capacities_rps=caps, capacity_probes={k: v["probes"] for k, v in found.items()},
                capacity_wall_s=cap_wall, status="running", runs_total=len(jobs))
    log("capacities (fcfs, stable-only): " + ", ".join(f"{k} {v:.4g} req/s" for k, v in caps.items())
        + f"  [{cap_wall:.0f} s]; {len(jobs)} runs to go")
    _write_json(out / "uniboost_meta.json", meta)

    points: dict[tuple, list[int]] = {}
    for i, j in enumerate(jobs):
        points.setdefault(_point_key(j), []).append(i)
    keys = list(points)
    batches = [keys[i:i + study.batch_points] for i in range(0, len(keys), study.batch_points)]
    rows: list[dict[str, Any]] = []
    def job_id(policy, params, setup_name, rate, seed, replica=0) -> str:
        return json.dumps([policy, params, setup_name, round(rate, 9), seed] + ([replica] if replica else []),
                          sort_keys=True, default=float)
    have: set[str] = set()
    if resume and (out / "uniboost_runs.json").exists() and old_meta is not None:
        # a run is kept only if its setup family is unchanged (the previous meta's Setup equals this study's)
        same = {k for k, v in asdict(study).items() if isinstance(v, dict) and "name" in v
                and _same_setup(old_meta["study"].get(k), getattr(study, k))}
        fam = {getattr(study, k).name for k in same}
        old_rows = {job_id(r["policy"], r["params"], r["setup"], r["rate"], r["seed"], r.get("replica", 0)): r
                    for r in json.loads((out / "uniboost_runs.json").read_text())}
        for j in jobs:
            base = j["setup"]["name"].split("_chunk")[0].split("_")[0]
            if base.startswith(study.replay.name) and base[len(study.replay.name):].isdigit():
                base = study.replay.name            # replay<N>: the replay family at N replicas
            jid = job_id(j["policy"], j["params"], j["setup"]["name"], j["rate"], j["seed"],
                         j["setup"]["replay_replica"])
            r = old_rows.get(jid)
            if r is not None and base in fam:
                rows.append(r)
                have.add(jid)
        meta["resumed_runs"] = len(rows)
        log(f"resume: {len(rows)} of {len(jobs)} runs kept from {out / 'uniboost_runs.json'} "
            f"(unchanged setups: {', '.join(sorted(fam))})")

    def flush(status: str) -> str:
        meta.update(status=status, runs_done=len(rows), wall_s=time.perf_counter() - t0)
        _write_json(out / "uniboost_runs.json", rows)
        _write_json(out / "uniboost_meta.json", meta)
        n_done: dict[tuple, int] = {}
        for r in rows:
            kk = (r["section"], r["setup"], r["label"], r["rho"])
            n_done[kk] = n_done.get(kk, 0) + 1
        missing = [k for k in keys if n_done.get(k, 0) < len(points[k])]
        md = report(study, rows, caps, derived, saturation)
        if missing:
            secs = sorted({k[0] for k in missing}, key=[k[0] for k in keys].index)
            md = md.replace("# UniBoost (seed 001) on tierserve\n", "# UniBoost (seed 001) on tierserve\n\n"
                            f"**{status}: {len(keys) - len(missing)} of {len(keys)} points finished "
                            f"({len(rows)} of {len(jobs)} runs). Sections with points still missing: "
                            f"{', '.join(secs)}. Not the complete study.**\n", 1)
        md += (f"\n_Capacity searches {cap_wall:.0f} s; {len(rows)} of {len(jobs)} runs; "
               f"wall {time.perf_counter() - t0:.0f} s ({executor})._\n")
        (out / "uniboost_report.md").write_text(md)
        gamma_plot(rows, study, out / "uniboost_gamma.png")
        return md

    def add_rows(idx: list[int], results: list) -> None:
        for i, r in zip(idx, results):
            if r is not None:
                rows.append({**r, "section": jobs[i]["section"], "rho": jobs[i]["rho"], "label": _label(jobs[i])})

    for b, batch in enumerate(batches, 1):
        idx = [i for k in batch for i in points[k]
               if job_id(jobs[i]["policy"], jobs[i]["params"], jobs[i]["setup"]["name"], jobs[i]["rate"],
                         jobs[i]["seed"], jobs[i]["setup"]["replay_replica"]) not in have]
        if not idx:
            continue
        # the longest runs first (boost-family policies, more requests), so the pool's tail is short
        idx.sort(key=lambda i: -(jobs[i]["setup"]["num_requests"] * (2.5 if "boost" in jobs[i]["policy"] else 1.0)))
        tb = time.perf_counter()
        try:
            res = run_many(run_point, [{k: v for k, v in jobs[i].items() if k not in ("section", "rho")}
                                       for i in idx], executor=executor, progress=True,
                           description=f"batch {b}/{len(batches)}")
        except Interrupted as e:
            add_rows(idx, e.results)
            flush("INTERRUPTED")
            raise
        add_rows(idx, res)
        for k in batch:
            g = [r for r in rows if (r["section"], r["setup"], r["label"], r["rho"]) == k]
            log(f"[{b}/{len(batches)}] {k[0]} {k[2]} ρ={k[3]}: stable {stable_share(g)}, "
                f"ttft.p95 {ci(g, 'ttft.p95')} s, ttlt.p99 {ci(g, 'ttlt.p99')} s, "
                f"preemptions {ci(g, 'preemptions')}")
        log(f"[{b}/{len(batches)}] batch of {len(idx)} runs in {time.perf_counter() - tb:.0f} s; "
            f"{len(rows)}/{len(jobs)} runs done, {time.perf_counter() - t0:.0f} s elapsed")
        flush("PARTIAL" if b < len(batches) else "complete")
    md = flush("complete")
    return {"markdown": md, "rows": rows, "capacities": caps}


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=float) + "\n")
    tmp.replace(path)


# ---- report -------------------------------------------------------------------------------------------------
def group(rows, section, label=None, rho=None, setup=None):
    return [r for r in rows if r["section"] == section and (label is None or r["label"] == label)
            and (rho is None or r["rho"] == rho) and (setup is None or r["setup"] == setup)]


def ci(rows, metric) -> str:
    vals = [r.get(metric, math.nan) for r in rows]
    vals = [v for v in vals if v is not None]
    if not vals:
        return "—"
    iv = mean_ci95(vals)
    return f"{iv.mean:.3g} ± {iv.half_width:.2g}" if math.isfinite(iv.half_width) else f"{iv.mean:.3g}"


def stable_share(rows) -> str:
    return f"{sum(r['stable'] for r in rows)}/{len(rows)}" if rows else "—"


def pct_vs(rows, base, metric, higher_better=False) -> str:
    """Mean over seeds of the per-seed % improvement vs `base` (seed 001's sign: positive = better), ± 95%."""
    by_seed = {r["seed"]: r.get(metric) for r in base}
    vals = []
    for r in rows:
        b, v = by_seed.get(r["seed"]), r.get(metric)
        if b is not None and v is not None and b > 0 and math.isfinite(v):
            vals.append(100.0 * ((v - b) if higher_better else (b - v)) / b)
    if not vals:
        return "—"
    iv = mean_ci95(vals)
    return f"{iv.mean:+.0f}% ± {iv.half_width:.0f}" if math.isfinite(iv.half_width) else f"{iv.mean:+.0f}%"


def per_seed_pct(rows, base, metric) -> str:
    by_seed = {r["seed"]: r.get(metric) for r in base}
    out = []
    for r in sorted(rows, key=lambda r: r["seed"]):
        b, v = by_seed.get(r["seed"]), r.get(metric)
        out.append(f"{100.0 * (b - v) / b:+.0f}%" if b and v is not None and math.isfinite(v) else "—")
    return ", ".join(out)


def per_seed_val(rows, metric) -> str:
    return ", ".join(f"{r.get(metric, math.nan):.0f}" for r in sorted(rows, key=lambda r: r["seed"]))


def gamma_plot(rows, study: Study, path: Path) -> Path | None:
    """γ over time (log scale) for each γ policy, one line per seed, with the offered load (rate profile) and
    γ-Ada's load estimate on a second axis."""
    g = [r for r in rows if r["section"] == "gamma" and r.get("gamma_trace")]
    if not g:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    colours = {"uniboost": "tab:orange", "uniboost[gamma_rule=nudge]": "tab:purple", "uniboost_memguard": "tab:green"}
    for r in sorted(g, key=lambda r: (r["label"], r["seed"])):
        tr = np.asarray(r["gamma_trace"], float)
        ax.plot(tr[:, 0], tr[:, 1], color=colours.get(r["label"], "k"), lw=1, alpha=0.8,
                label=r["label"] if r["seed"] == study.seeds[0] else None)
        if r["label"] == "uniboost":
            ax2.plot(tr[:, 0], tr[:, 2], color="tab:orange", lw=1, alpha=0.6,
                     label="γ-Ada's estimate λ·E[S]" if r["seed"] == study.seeds[0] else None)
    prof = study.gamma.rate_profile or (1.0,)
    r0 = next(r for r in g if r["seed"] == study.seeds[0])
    starts = list(r0["segment_starts_s"]) + [max(t[0] for t in r0["gamma_trace"])]
    for j, m in enumerate(prof):
        ax2.hlines(m, starts[j], starts[j + 1], color="k", lw=2, label="offered ρ (× fcfs capacity), seed 0"
                   if j == 0 else None)
        ax.axvline(starts[j], color="grey", lw=0.5, ls=":")
    ax.set_yscale("log")
    ax.set_ylabel("γ (1/s)")
    ax.legend(fontsize=8)
    ax.set_title(f"γ over time, {study.gamma.model}, {study.gamma.num_requests} requests, seeds {list(study.seeds)}")
    ax2.set_ylabel("load")
    ax2.set_xlabel("simulated time (s)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pct_paired(rows, base, metric) -> str:
    """Like `pct_vs`, pairing runs by (seed, replica); the per-pair changes are averaged within a seed first, so
    the interval is over seeds (replicas of one seed share a trace)."""
    by = {(r["seed"], r.get("replica", 0)): r.get(metric) for r in base}
    per_seed: dict[int, list[float]] = {}
    for r in rows:
        b, v = by.get((r["seed"], r.get("replica", 0))), r.get(metric)
        if b is not None and v is not None and b > 0 and math.isfinite(v):
            per_seed.setdefault(r["seed"], []).append(100.0 * (b - v) / b)
    if not per_seed:
        return "—"
    iv = mean_ci95([float(np.mean(v)) for v in per_seed.values()])
    return f"{iv.mean:+.0f}% ± {iv.half_width:.0f}" if math.isfinite(iv.half_width) else f"{iv.mean:+.0f}%"


def _ratio(a_rows, b_rows, metric) -> str:
    a = [r[metric] for r in a_rows if r.get(metric) is not None]
    b = [r[metric] for r in b_rows if r.get(metric) is not None]
    return f"{np.mean(a) / np.mean(b):.2f}×" if a and b and np.mean(b) > 0 else "—"


def report(study: Study, rows, caps, derived=None, saturation=None) -> str:
    derived = derived or {}
    saturation = saturation or {}
    lines = ["# UniBoost (seed 001) on tierserve", "",
             f"Seeds {list(study.seeds)}; steady state = ⌊0.1·n⌋ first and last arrivals dropped; ± = 95% interval "
             "over seeds; `stable` = seeds whose queue-trend verdict is stable. ρ = rate / stable-only capacity "
             "of `fcfs` on the same setup. Improvements use seed 001's sign: positive = better.", "",
             "Capacities (fcfs, stable-only): " + ", ".join(
                 f"{k} {v:.4g} req/s" + (" (derived: " + derived[k] + ")" if k in derived else "")
                 for k, v in caps.items() if k in derived or k in (study.table2.name, study.fig7.name,
                                                                    study.starvation.name)), ""]
    sec_rows = lambda s: [r for r in rows if r["section"] == s]  # noqa: E731
    for rho in study.table2_rhos if sec_rows("table2") else ():
        base = group(rows, "table2", "srpt", rho)
        lines += [f"## Table 2 — % change vs srpt (TRAIL+), ρ = {rho} ({rho * caps[study.table2.name]:.3g} req/s), "
                  f"{study.table2.model}, {study.table2.num_requests} requests, 70% reasoning + 30% Azure conv", "",
                  "| policy | stable | " + " | ".join(METRICS) + " |", "|" + "---|" * (len(METRICS) + 2)]
        for p in _table2_policies(study, rho):
            g = group(rows, "table2", p, rho)
            cells = [pct_vs(g, base, m, higher_better=(m == "tokens_per_s")) for m in METRICS]
            lines.append(f"| {p} | {stable_share(g)} | " + " | ".join(cells) + " |")
        lines += ["", "Absolute values (s; tokens/s):", "",
                  "| policy | ttft.p95 | ttft.p99 | ttlt.p50 | ttlt.p99 | tpot.p99 | tokens_per_s | "
                  "preemptions (forced) |", "|---|---|---|---|---|---|---|---|"]
        for p in _table2_policies(study, rho):
            g = group(rows, "table2", p, rho)
            lines.append(f"| {p} | {ci(g, 'ttft.p95')} | {ci(g, 'ttft.p99')} | {ci(g, 'ttlt.p50')} | "
                         f"{ci(g, 'ttlt.p99')} | {ci(g, 'tpot.p99')} | {ci(g, 'tokens_per_s')} | "
                         f"{ci(g, 'preemptions')} ({ci(g, 'forced_preemptions')}) |")
        fc = group(rows, "table2", "fcfs", rho)
        ub = group(rows, "table2", "uniboost", rho)
        lines += ["", f"Headline at ρ = {rho}: UniBoost vs srpt — P99 TTLT {pct_vs(ub, base, 'ttlt.p99')} "
                  f"(seed: +{SEED_HEADLINE['uniboost.ttlt.p99']:.0f}%), P95 TTFT {pct_vs(ub, base, 'ttft.p95')} "
                  f"(seed: +{SEED_HEADLINE['uniboost.ttft.p95']:.0f}%); vs fcfs — P99 TTLT "
                  f"{pct_vs(ub, fc, 'ttlt.p99')}, P95 TTFT {pct_vs(ub, fc, 'ttft.p95')}.", "",
                  f"Per seed {[r['seed'] for r in sorted(ub, key=lambda r: r['seed'])]}: vs srpt P99 TTLT "
                  f"{per_seed_pct(ub, base, 'ttlt.p99')}, P95 TTFT {per_seed_pct(ub, base, 'ttft.p95')}; vs fcfs "
                  f"P99 TTLT {per_seed_pct(ub, fc, 'ttlt.p99')}, P95 TTFT {per_seed_pct(ub, fc, 'ttft.p95')}; "
                  f"preemptions (uniboost / srpt / fcfs) {per_seed_val(ub, 'preemptions')} / "
                  f"{per_seed_val(base, 'preemptions')} / {per_seed_val(fc, 'preemptions')}.", ""]
        lines += [f"### §4.4 — tightest SLO scale met by 99% (P99 of latency / unloaded latency), ρ = {rho}", "",
                  "| policy | TTFT scale | TTLT scale | TTFT gain of uniboost | TTLT gain of uniboost |",
                  "|---|---|---|---|---|"]
        for p in _table2_policies(study, rho):
            g = group(rows, "table2", p, rho)
            lines.append(f"| {p} | {ci(g, 'ttft_scale99')} | {ci(g, 'ttlt_scale99')} | "
                         f"{_ratio(g, ub, 'ttft_scale99')} | {_ratio(g, ub, 'ttlt_scale99')} |")
        lines += ["", f"(seed: {SEED_SLO_GAIN[0]}–{SEED_SLO_GAIN[1]}× tighter TTFT SLO at 99% with UniBoost)", ""]
    if sec_rows("fig7"):
        cap = caps[study.fig7.name]
        for metric, name in (("ttft", "TTFT"), ("ttlt", "TTLT")):
            lines += [f"## Fig. 7 — {study.fig7.model} TP1 on {study.fig7.gpu}, {study.fig7.num_requests} requests: "
                      f"P90 / P99 {name} (s) vs ρ (stable seeds)", "",
                      "| policy | " + " | ".join(f"ρ={r} ({r * cap:.3g} req/s)" for r in study.fig7_rhos) + " |",
                      "|" + "---|" * (len(study.fig7_rhos) + 1)]
            for p in ("fcfs", *ABLATION):
                cells = []
                for rho in study.fig7_rhos:
                    g = group(rows, "fig7", p, rho)
                    cells.append(f"{ci(g, metric + '.p90')} / {ci(g, metric + '.p99')} ({stable_share(g)})"
                                 if g else "—")
                lines.append(f"| {p} | " + " | ".join(cells) + " |")
            lines.append("")
        lines += ["Preemptions per run (forced = outside MemGuard's rules; for policies without MemGuard every "
                  "eviction counts as forced):", "",
                  "| policy | " + " | ".join(f"ρ={r}" for r in study.fig7_rhos) + " |",
                  "|" + "---|" * (len(study.fig7_rhos) + 1)]
        for p in ("fcfs", *ABLATION):
            cells = [f"{ci(g, 'preemptions')} ({ci(g, 'forced_preemptions')})" if (g := group(rows, "fig7", p, rho))
                     else "—" for rho in study.fig7_rhos]
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lines += ["", f"(seed: {SEED_FIG7})", ""]
    sens = [r for r in rows if r["section"].startswith("sens_")]
    if sens:
        rho = study.sens_rho
        ref = group(rows, "fig7", "uniboost", rho)
        ref_f = group(rows, "fig7", "fcfs", rho)
        lines += [f"## Tables 6–8 — sensitivity of uniboost on the Fig. 7 setup, ρ = {rho}", "",
                  "Default: k = 256, δ = 32, chunk (token budget) 2,048 — the Fig. 7 point at this ρ. "
                  "% = change vs that default (positive = better); Table 8's rows also vs `fcfs` at the same chunk.",
                  "", "| variant | stable | ttft.p99 (s) | ttlt.p99 (s) | tpot.p99 (s) | preemptions | "
                  "Δ ttft.p99 | Δ ttlt.p99 |", "|---|---|---|---|---|---|---|---|"]

        def row(name, g, base):
            return (f"| {name} | {stable_share(g)} | {ci(g, 'ttft.p99')} | {ci(g, 'ttlt.p99')} | {ci(g, 'tpot.p99')} | "
                    f"{ci(g, 'preemptions')} | {pct_vs(g, base, 'ttft.p99')} | {pct_vs(g, base, 'ttlt.p99')} |")
        lines.append(row("uniboost default (k=256, δ=32, chunk 2048)", ref, ref))
        for k in study.ks:
            lines.append(row(f"Table 6: k = {k}", group(rows, "sens_k", f"uniboost[k={k}]"), ref))
        for d in study.deltas:
            lines.append(row(f"Table 7: δ = {d}", group(rows, "sens_delta", f"uniboost[delta={d}]"), ref))
        lines.append(row("fcfs, chunk 2048", ref_f, ref_f))
        for c in study.chunks:
            f_ = group(rows, "sens_chunk", "fcfs", setup=f"{study.fig7.name}_chunk{c}")
            u_ = group(rows, "sens_chunk", "uniboost", setup=f"{study.fig7.name}_chunk{c}")
            lines.append(row(f"Table 8: fcfs, chunk {c}", f_, f_))
            lines.append(row(f"Table 8: uniboost, chunk {c} (Δ vs fcfs at chunk {c})", u_, f_))
        lines.append(row("uniboost, chunk 2048 (Δ vs fcfs at chunk 2048)", ref, ref_f))
        lines.append("")
    if sec_rows("starvation"):
        su = study.starvation
        size = su.replay_of or su.num_replicas
        how = (f"replay: one replica's share of the {size}-replica trace per seed, simulated alone"
               if su.replay_of else f"{size} replicas simulated together")
        lines += [f"## A.3 — starvation: 90% short (125/100) + 10% long (2k/6k), ρ = {study.starvation_rho} "
                  f"of fcfs's stable-only capacity on these runs ({study.starvation_rho * caps[su.name]:.4g} req/s "
                  f"on {size} "
                  f"replicas), {su.cluster_policy} dispatch ({how}), {su.num_requests} requests per replica", "",
                  "Slope = least-squares slope of finished long requests' E2E latency against arrival time, per "
                  "request of the cluster's arrival order (s/req; seed 001's regression on request ids); growth = "
                  "that slope × the fitted arrival span (s). Per seed: the fit's own 95% interval; ± here = over "
                  "seeds. `unfinished` = long requests of the steady-state window still unfinished when the run "
                  f"stopped ({su.drain_s:.0f} s after the last arrival).", ""]
        if su.name in saturation:
            sat = saturation[su.name]
            lines += [f"fcfs's saturation throughput (backlog of {sat['requests']} requests on one replica, per seed): "
                      + ", ".join(f"{v:.3g}" for v in sat["per_replica_per_seed"]) + f" req/s per replica, vs its "
                      f"stable-only capacity {caps[su.name] / size:.3g} req/s per replica on these runs.", ""]
        lines += [
                  "| policy | stable | arrivals (s) | short E2E p50 / p99 (s) | long E2E p50 / p99 (s) | long slope "
                  "(s/req) | growth over the run (s) | per-seed slope ± its 95% (s/req) | long preempted p99 (s) | "
                  "long unfinished | preemptions |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in study.starvation_policies:
            g = group(rows, "starvation", p)
            if g:
                per_seed = "; ".join(f"{r['long_slope_s_per_req']:+.2g} ± {r['long_slope_hw_s_per_req']:.1g}"
                                     if "long_slope_hw_s_per_req" in r else "—" for r in g)
                lines.append(f"| {p} | {stable_share(g)} | {ci(g, 'arrival_span_s')} | {ci(g, 'short_e2e.p50')} / "
                             f"{ci(g, 'short_e2e.p99')} | {ci(g, 'long_e2e.p50')} / {ci(g, 'long_e2e.p99')} | "
                             f"{ci(g, 'long_slope_s_per_req')} | {ci(g, 'long_growth_s')} | {per_seed} | "
                             f"{ci(g, 'long_preempted_s.p99')} | {ci(g, 'long_unfinished')} | {ci(g, 'preemptions')} |")
        lines += ["", "(seed: slopes ≈ 0.0003 s/req, no policy starves long requests at ρ < 1)", ""]
    if sec_rows("tiers"):
        k = study.tiers.num_tiers
        lines += [f"## Tiers — {k} tiers (enterprise mix, default SLOs), ρ = {study.tiers_rho} "
                  f"({study.tiers_rho * caps[study.tiers.name]:.3g} req/s), {study.tiers.num_requests} requests "
                  "(no seed counterpart)", "",
                  "| policy | stable | " + " | ".join(f"tier{t} TTFT p99 (s) / attainment" for t in range(k)) + " |",
                  "|" + "---|" * (k + 2)]
        for lab in sorted({r["label"] for r in rows if r["section"] == "tiers"}):
            g = group(rows, "tiers", lab)
            lines.append(f"| {lab} | {stable_share(g)} | " + " | ".join(
                f"{ci(g, f'tier{t}.ttft.p99')} / {ci(g, f'tier{t}.attainment')}" for t in range(k)) + " |")
        lines.append("")
    if any(r["section"].startswith("dispatch_") for r in rows):
        su = study.dispatch
        lines += [f"## Table 9 — uniboost vs vllm under dispatch policies, {su.num_replicas} × {su.model} replicas, "
                  f"{su.num_requests} requests, ρ = {study.dispatch_rho} ({study.dispatch_rho * caps[su.name]:.4g} "
                  "req/s)", "", "% = improvement of uniboost over vllm (positive = better), per seed, mean ± 95%.",
                  "", "| dispatch | stable (vllm / uniboost) | TTFT p99 | TBT (TPOT) p99 | E2E p99 | E2E p50 | "
                  "vllm E2E p99 (s) | uniboost E2E p99 (s) | preemptions per replica (vllm / uniboost) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for cp in ("random", "round_robin", "jsq"):
            v, u = group(rows, f"dispatch_{cp}", "vllm"), group(rows, f"dispatch_{cp}", "uniboost")
            if v or u:
                per = lambda g: ci([{**r, "pp": r["preemptions"] / su.num_replicas} for r in g], "pp")  # noqa: E731
                lines.append(f"| {cp} | {stable_share(v)} / {stable_share(u)} | {pct_vs(u, v, 'ttft.p99')} | "
                             f"{pct_vs(u, v, 'tpot.p99')} | {pct_vs(u, v, 'ttlt.p99')} | {pct_vs(u, v, 'ttlt.p50')} "
                             f"| {ci(v, 'ttlt.p99')} | {ci(u, 'ttlt.p99')} | {per(v)} / {per(u)} |")
        lines.append("")
    if sec_rows("replay"):
        su = study.replay
        lines += [f"## Table 10 — uniboost vs vllm by trace replay, 32…512 replicas of {su.model}, random dispatch, "
                  f"ρ = {study.replay_rho}", "",
                  f"Arrivals: the Azure 2023 conversation trace's inter-arrival gaps (bursty), from a random start per "
                  f"seed, rescaled to the cluster's rate N × ρ × the one-replica capacity and dispatched at random; "
                  f"{study.replay_sampled} replicas' shares per seed simulated alone, {su.num_requests} requests "
                  "each on average. % = improvement of uniboost over vllm on the same replica's requests, averaged "
                  "over the sampled replicas of a seed, then mean ± 95% over seeds.", "",
                  "| replicas | cluster rate (req/s) | stable (vllm / uniboost) | TTFT p99 | TBT (TPOT) p99 | "
                  "E2E p99 | "
                  "E2E p50 | vllm E2E p99 (s) | uniboost E2E p99 (s) | preemptions per replica (vllm / uniboost) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for size in study.replay_sizes:
            v = group(rows, "replay", "vllm", setup=f"replay{size}")
            u = group(rows, "replay", "uniboost", setup=f"replay{size}")
            if v or u:
                lines.append(f"| {size} | {study.replay_rho * caps.get(f'replay{size}', math.nan):.4g} | "
                             f"{stable_share(v)} / {stable_share(u)} | {pct_paired(u, v, 'ttft.p99')} | "
                             f"{pct_paired(u, v, 'tpot.p99')} | {pct_paired(u, v, 'ttlt.p99')} | "
                             f"{pct_paired(u, v, 'ttlt.p50')} | {ci(v, 'ttlt.p99')} | {ci(u, 'ttlt.p99')} | "
                             f"{ci(v, 'preemptions')} / {ci(u, 'preemptions')} |")
        lines += ["", "(seed: gains consistent from 32 to 512 replicas)", ""]
    if sec_rows("gamma"):
        su = study.gamma
        cap = caps.get(su.name, math.nan)
        prof = su.rate_profile or (1.0,)
        lines += [f"## γ-Ada over time — {su.model}, Table 2's mix, {su.num_requests} requests, load stepping "
                  + " → ".join(f"{m:g}" for m in prof) + f" × fcfs's capacity ({cap:.4g} req/s)", "",
                  "Per load segment (by completion time): median γ at completion (1/s) and γ-Ada's load estimate "
                  "λ·E[S] (S = a finished request's share of the GPU time of the iterations it ran in, so λ·E[S] is the "
                  "replica's busy fraction), mean ± 95% "
                  "over seeds; then the tails of the requests arriving in each segment. `uniboost_memguard` keeps "
                  "γ fixed at its start value; `uniboost[gamma_rule=nudge]` is the seed code's p99/p95 nudge. "
                  "Plot: uniboost_gamma.png.", "",
                  "| policy | stable | " + " | ".join(f"seg {j} (×{m:g}): γ / load est." for j, m in enumerate(prof))
                  + " | TTFT p95 (s) | TTLT p99 (s) | TTLT p99 by segment (s) |", "|" + "---|" * (len(prof) + 5)]
        for lab in ("uniboost", "uniboost[gamma_rule=nudge]", "uniboost_memguard"):
            g = group(rows, "gamma", lab)
            if g:
                segs = " | ".join(f"{ci(g, f'seg{j}.gamma.p50')} / {ci(g, f'seg{j}.load.p50')}"
                                  for j in range(len(prof)))
                by_seg = " / ".join(ci(g, f"seg{j}.ttlt.p99") for j in range(len(prof)))
                lines.append(f"| {lab} | {stable_share(g)} | {segs} | {ci(g, 'ttft.p95')} | {ci(g, 'ttlt.p99')} | "
                             f"{by_seg} |")
        fixed = group(rows, "gamma", "uniboost_memguard")
        ada = group(rows, "gamma", "uniboost")
        lines += ["", f"γ-Ada vs fixed γ (uniboost vs uniboost_memguard): P99 TTLT {pct_vs(ada, fixed, 'ttlt.p99')}, "
                  f"P95 TTFT {pct_vs(ada, fixed, 'ttft.p95')} (positive = γ-Ada better).", ""]
    return "\n".join(lines)
