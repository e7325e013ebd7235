"""Seed 001 (UniBoost) reproduced on tierserve's replica model, in units of measured capacity.

Every point is a (policy, setup, ρ, seed) run judged by the work verdict (`tierserve.metrics.stability`: the
unfinished work's growth, warm-up found and dropped) and summarised from the warm-up's end on; points are
reported as mean ± 95% over ≥ 3 seeds, with the share of seeds whose queue was stable. In `Study.grown_sections`
(Fig. 7 and its sensitivity tables) a point's run length is the verdict's choice: its setup's requests, doubled
while undecided, up to `Study.point_growth` × them; each row states the length chosen. ρ = rate / the stable-only capacity of `fcfs` (Sarathi order) on the same setup,
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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core import Status
from tierserve.experiments.uniboost_runs import (  # noqa: F401  (the study's names, importable from here)
    ABLATION, ARRIVALS, METRICS, SECTIONS, SEED_FIG7, SEED_HEADLINE, SEED_SLO_GAIN, TABLE2_POLICIES, PointRunner,
    Setup, _cluster, gamma_numbers, long_request_trend, mixed_requests, run_point, simulate_point,
    starvation_numbers, with_preempt_mode,
)

CAPACITY_GROWTH = 8      # a capacity probe runs the setup's requests, doubled while undecided, up to 8× them


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
    # One preemption mode for every stack (issue 23): with MemGuard UniBoost swaps whenever that is cheaper, so
    # the baselines swap too; `preempt_rows` adds each listed policy with recompute as its own labelled row.
    preempt_mode: str = "swap"
    preempt_rows: tuple[str, ...] = ("fcfs", "srpt")
    # Run lengths of the points (issue 23): in these sections each (point, seed) runs its setup's requests first
    # and doubles while its work verdict is undecided, up to `point_growth` × them (the bound the capacity probes
    # use); every row states the length chosen. Elsewhere a point runs its setup's length once.
    grown_sections: tuple[str, ...] = ("fig7", "sensitivity")
    point_growth: int = CAPACITY_GROWTH
    batch_points: int = 4                    # points (all seeds of one configuration) per batch of runs

    @classmethod
    def quick(cls) -> Study:
        small = Setup(num_requests=240)
        return cls(table2=small, table2_rhos=(0.9,), sections=("table2", "starvation"),
                   starvation=Setup(name="starvation", workload="starvation", num_replicas=1,
                                    cluster_policy="random", num_requests=300, replay_of=8),
                   saturation_requests=300, capacity_rel_tol=0.1, batch_points=8)


# ---- the study --------------------------------------------------------------------------------------------
def _capacity_guess(setup: Setup) -> float:
    """A crude service-rate estimate (mean tokens at full-batch cost) to start the search from."""
    from tierserve.hardware.exec_model import make_execution_model
    reqs = mixed_requests(setup, 1.0, 0)
    pred = make_execution_model(setup.model, setup.gpu, 1)
    per_tok = pred.iteration_time(2048, 2048 * 1024, 0, 0) / 2048
    return (setup.replay_of or setup.num_replicas) / (per_tok * np.mean([r.prompt_tokens + r.output_tokens
                                                                         for r in reqs]))


def _cap_run(setup: dict, rate: float, seed: int, mode: str = "recompute") -> tuple[bool, int]:
    """(stable, requests run) of `fcfs` at one probe: the setup's length, doubled while undecided up to
    `CAPACITY_GROWTH`×."""
    from tierserve.experiments.capacity import RunLength, judged_run
    su = Setup(**setup)
    run = judged_run(PointRunner("fcfs", (), su, mode), rate, seed,
                     RunLength(su.num_requests, CAPACITY_GROWTH * su.num_requests))
    return bool(run.stable), run.num_requests


def capacities(setups: list[Setup], seeds, rel_tol: float, executor: str, log=print,
               guesses: dict[str, float] | None = None, mode: str = "recompute") -> dict[str, dict]:
    """Stable-only capacity (req/s) of `fcfs` on each setup: the highest probed rate at which a majority of seeds
    is judged stable, to `rel_tol`. Geometric search from `guesses[name]` or `_capacity_guess` (doubling/halving
    until bracketed, then bisection); one probe per unfinished setup per batch, all seeds of all probes in one
    pool batch."""
    from tierserve.experiments.runs import run_many
    guesses = guesses or {}
    state = {s.name: {"setup": s, "lo": None, "hi": None, "next": guesses.get(s.name) or _capacity_guess(s),
                      "probes": []} for s in setups}
    for rnd in range(1, 16):
        open_ = [st for st in state.values()
                 if not (st["lo"] and st["hi"] and st["hi"] / st["lo"] <= 1 + rel_tol)]
        if not open_:
            break
        jobs = [{"setup": asdict(st["setup"]), "rate": st["next"], "seed": sd, "mode": mode}
                for st in open_ for sd in seeds]
        t0 = time.perf_counter()
        answers = run_many(_cap_run, jobs, executor=executor, progress=False, description="capacity probes")
        for i, st in enumerate(open_):
            v = [a[0] for a in answers[i * len(seeds):(i + 1) * len(seeds)]]
            lengths = [a[1] for a in answers[i * len(seeds):(i + 1) * len(seeds)]]
            ok, rate = sum(v) * 2 > len(v), st["next"]
            st["probes"].append((rate, int(sum(v)), len(v), lengths))
            if ok:
                st["lo"] = rate
                st["next"] = rate * 2 if st["hi"] is None else math.sqrt(rate * st["hi"])
            else:
                st["hi"] = rate
                st["next"] = rate / 2 if st["lo"] is None else math.sqrt(rate * st["lo"])
            log(f"[capacity {rnd}] {st['setup'].name}: {rate:.4g} req/s -> {int(sum(v))}/{len(v)} seeds stable "
                f"(runs of {lengths} requests); "
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
    from tierserve.experiments.runs import run_many
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
        most = point_most(study, sec, setup)
        for s in study.seeds:
            for rep in (replicas(s) if replicas else [setup.replay_replica]):
                su = replace(setup, replay_replica=rep)
                jobs.append({"section": section, "policy": policy, "params": params, "setup": asdict(su),
                             "rate": rho * caps[setup.name], "seed": s, "rho": rho, "mode": study.preempt_mode,
                             "most": most})

    def add_mode_rows(section, setup, rho):
        for p in study.preempt_rows:
            add(section, p, {"preempt_mode": "recompute"}, setup, rho)
    for sec in study.sections:
        if sec == "table2":
            for rho in study.table2_rhos:
                for p in _table2_policies(study, rho):
                    add("table2", p, {}, study.table2, rho)
                if rho == study.table2_main_rho:
                    add_mode_rows("table2", study.table2, rho)
        elif sec == "fig7":
            for rho in study.fig7_rhos:
                for p in ("fcfs", *ABLATION):
                    add("fig7", p, {}, study.fig7, rho)
                add_mode_rows("fig7", study.fig7, rho)
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


def point_most(study: Study, section: str, setup: Setup) -> int | None:
    """The most requests a point of `section` may run (None: its setup's length, once); see `Study.grown_sections`."""
    if section not in study.grown_sections:
        return None
    if not (isinstance(study.point_growth, int) and study.point_growth >= 1):
        from tierserve.core import ConfigError
        raise ConfigError("point_growth", study.point_growth, "an integer >= 1 (the bound on a point's run length, "
                          "in multiples of its setup's requests)")
    return study.point_growth * setup.num_requests


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


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=float) + "\n")
    tmp.replace(path)


