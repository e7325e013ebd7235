"""The same trace through the router (real engines) and through the simulator (the engines' calibrated step
model), with the same cluster policy: per-tier dispatch shares and TTFT/TTLT P50/P90 side by side.

The pieces `benchmarks/router_vs_sim.py` runs, kept free of engines so they are tested without vLLM:
  * `make_trace`: a seeded trace (Poisson arrivals, uniform prompt and answer lengths, a tier mix);
  * `fit_step_model`: the engines' iteration logs of the calibration runs, fitted on the mean step time
    (`calibrate_from_iterations(objective="mean")`, as `benchmarks/sim_to_real.py` calibrates vLLM-CPU: a
    simulation sums step times, so the model must be right on the mean);
  * `frontend_delays`: per request of a calibration run, client send -> the engine's arrival stamp (the router
    and the API server), engine first/last token -> client; each simulated request draws one measured row;
  * `simulate_trace`: the validation run's requests (arrivals = their real send times + a drawn delay) on as
    many simulated replicas, with the engines' limits, the step model, the engines' local policy and the
    router's cluster policy;
  * `comparison`: the table, real and simulated per tier, with a seeded bootstrap 95% interval of each real
    quantile ('*' marks a simulated value inside it).
"""
from __future__ import annotations

import csv
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from tierserve.core import NO_SLO, Request
from tierserve.router.loopback import EngineLimits

QUANTILES = (50, 90)
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class TraceShape:
    tier_mix: tuple[float, ...] = (0.2, 0.3, 0.5)
    prompt: tuple[int, int] = (32, 256)
    output: tuple[int, int] = (16, 96)

    def check(self, limits: EngineLimits) -> None:
        if not self.tier_mix or any(not (w >= 0) for w in self.tier_mix) or sum(self.tier_mix) <= 0:
            raise ValueError(f"tier_mix: got {self.tier_mix}; allowed: non-negative weights, not all zero")
        for name, (lo, hi) in (("prompt", self.prompt), ("output", self.output)):
            if not 1 <= lo <= hi:
                raise ValueError(f"{name}: got ({lo}, {hi}); allowed: 1 <= low <= high")
        if self.prompt[1] + self.output[1] > limits.max_model_len:
            raise ValueError(f"prompt + output: up to {self.prompt[1] + self.output[1]} tokens; allowed: at most "
                             f"max_model_len {limits.max_model_len}")


def make_trace(n: int, rate: float, seed: int, shape: TraceShape = TraceShape()) -> list[dict]:
    """n requests; Poisson arrivals at `rate` req/s (rate <= 0: all at time 0); uniform lengths; the tier mix."""
    if n < 1:
        raise ValueError(f"n: got {n}; allowed: >= 1")
    rng = random.Random(seed)
    t, out = 0.0, []
    tiers = range(len(shape.tier_mix))
    for i in range(n):
        if rate > 0:
            t += rng.expovariate(rate)
        out.append({"i": i, "arrival_s": t, "prompt_tokens": rng.randint(*shape.prompt),
                    "output_tokens": rng.randint(*shape.output), "tier": rng.choices(tiers, shape.tier_mix)[0]})
    return out


# ---- the step model ----------------------------------------------------------------------------------------
def iteration_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


def fit_step_model(rows: Sequence[dict], out: Path) -> tuple[Path, dict]:
    """The mean (least-squares) fit of `rows` (iteration-log rows of every engine), written as a fit file the
    simulator's `exec_model_file` reads."""
    from tierserve.hardware.iteration_calibration import calibrate_from_iterations
    if not rows:
        raise ValueError("fit_step_model: no iteration rows (were the engines' iteration logs on?)")
    out.parent.mkdir(parents=True, exist_ok=True)
    csv_path = out.with_suffix(".csv")
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    fit = calibrate_from_iterations(csv_path, objective="mean")
    data = asdict(fit)
    out.write_text(json.dumps(data, indent=1))
    return out, data


# ---- the frontend ------------------------------------------------------------------------------------------
def frontend_delays(real: Sequence[dict], records: dict[int, dict]) -> np.ndarray:
    """Rows (in, out_first, out_last), seconds, of the answered requests the engines logged."""
    rows = [(records[r["i"]]["arrival_s"] - r["sent_s"], r["first_s"] - records[r["i"]]["first_token_s"],
             r["last_s"] - records[r["i"]]["finish_s"])
            for r in sorted(real, key=lambda r: r["i"]) if r["i"] in records and r["first_s"] is not None]
    return np.array(rows, dtype=float).reshape(-1, 3)


def real_rows(real: Sequence[dict], records: dict[int, dict]) -> list[dict]:
    """Answered requests: tier, the engine that served them (from its own request log), TTFT and TTLT."""
    return [{"tier": r["tier"], "replica": records[r["i"]]["engine"], "ttft": r["ttft"], "ttlt": r["ttlt"]}
            for r in real if r["status"] == 200 and r["ttft"] is not None and r["i"] in records]


def simulate_trace(real: Sequence[dict], delays: np.ndarray, fit_path: Path, limits: EngineLimits,
                   num_engines: int, cluster_policy: str, local_policy: str, num_tiers: int, seed: int,
                   cluster_policy_params: dict | None = None) -> list[dict]:
    """The real run's requests (send times from the first send) through the simulator; latencies from the
    send, with each request's drawn frontend delays."""
    from tierserve.sim.config import ClusterConfig, ReplicaConfig
    from tierserve.sim.simulate import simulate
    if len(delays) == 0:
        raise ValueError("simulate_trace: no frontend delays measured (the calibration run answered nothing?)")
    sent = sorted(real, key=lambda r: (r["sent_s"], r["i"]))
    t0 = sent[0]["sent_s"]
    draw = delays[np.random.default_rng(seed).integers(0, len(delays), len(sent))]
    cfg = ClusterConfig(num_replicas=num_engines, local_policy=local_policy, cluster_policy=cluster_policy,
                        cluster_policy_params=cluster_policy_params or {},
                        replica=ReplicaConfig(block_size=limits.block_size, num_blocks=limits.num_blocks - 1,
                                              token_budget=limits.token_budget, max_num_seqs=limits.max_num_seqs,
                                              max_model_len=limits.max_model_len, exec_model_file=str(fit_path)))
    at_engine = sorted(range(len(sent)), key=lambda k: (sent[k]["sent_s"] - t0 + draw[k, 0], k))
    reqs = [Request(k, sent[k]["sent_s"] - t0 + draw[k, 0], sent[k]["prompt_tokens"], sent[k]["output_tokens"],
                    sent[k]["tier"], NO_SLO) for k in at_engine]
    res = simulate(cfg, reqs, num_tiers=num_tiers, seed=seed)
    out = []
    for s in res.states:
        if s.finish_s < 0 or s.first_token_s < 0:
            continue
        k, send = s.id, sent[s.id]["sent_s"] - t0
        out.append({"tier": s.tier, "replica": s.replica, "ttft": s.first_token_s + draw[k, 1] - send,
                    "ttlt": s.finish_s + draw[k, 2] - send})
    return out


# ---- the table -----------------------------------------------------------------------------------------------
def bootstrap_ci(values: Sequence[float], q: float, seed: int = 0,
                 resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return (float("nan"), float("nan"))
    idx = np.random.default_rng(seed).integers(0, v.size, (resamples, v.size))
    qs = np.percentile(v[idx], q, axis=1)
    return float(np.percentile(qs, 2.5)), float(np.percentile(qs, 97.5))


def _shares(rows: Sequence[dict], tier: int, num_engines: int) -> list[float]:
    mine = [r["replica"] for r in rows if r["tier"] == tier]
    return [sum(1 for e in mine if e == k) / len(mine) if mine else float("nan") for k in range(num_engines)]


def comparison(real: Sequence[dict], sim: Sequence[dict], tier_names: Sequence[str], num_engines: int,
               seed: int = 0) -> tuple[list[str], dict]:
    """Per tier: n, dispatch shares per engine, TTFT/TTLT P50/P90; real (with its bootstrap 95% interval) vs
    sim. Returns the printed lines and the numbers."""
    head = (f"{'tier':<8} {'n':>4} {'dispatch share e0/e1.. real':>28} {'sim':>14} | "
            + " | ".join(f"{m} P{q} real [95% CI] / sim (s)" for m in ("TTFT", "TTLT") for q in QUANTILES))
    lines, data, inside, cells = [head], {}, 0, 0
    for t, name in enumerate(tier_names):
        r = [x for x in real if x["tier"] == t]
        s = [x for x in sim if x["tier"] == t]
        row = {"n_real": len(r), "n_sim": len(s), "share_real": _shares(real, t, num_engines),
               "share_sim": _shares(sim, t, num_engines)}
        parts = []
        for metric in ("ttft", "ttlt"):
            rv, sv = [x[metric] for x in r], [x[metric] for x in s]
            for q in QUANTILES:
                rq = float(np.percentile(rv, q)) if rv else float("nan")
                sq = float(np.percentile(sv, q)) if sv else float("nan")
                lo, hi = bootstrap_ci(rv, q, seed)
                hit = lo <= sq <= hi
                inside += hit
                cells += 1
                row[f"{metric}_p{q}"] = {"real": rq, "ci": [lo, hi], "sim": sq}
                parts.append(f"{rq:6.3f} [{lo:5.3f},{hi:5.3f}] / {sq:6.3f}{'*' if hit else ' '}")
        data[name] = row
        share = lambda v: "/".join(f"{x:.2f}" for x in v)   # noqa: E731
        lines.append(f"{name:<8} {len(r):>4} {share(row['share_real']):>28} {share(row['share_sim']):>14} | "
                     + " | ".join(parts))
    lines.append(f"'*': simulated value inside the real run's bootstrap 95% interval ({inside}/{cells} cells)")
    data["_inside"] = [inside, cells]
    return lines, data
