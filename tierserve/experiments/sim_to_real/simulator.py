"""sim_to_real's simulated side: the same trace through tierserve's simulator with the engine's limits, a
fitted step model, the measured frontend, and optionally step-time variability or the machine's speed."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tierserve.core import Request
from tierserve.experiments.sim_to_real.step_model import SPEED_MIN_ROWS, SPEED_WINDOW_S, step_features
from tierserve.experiments.sim_to_real.workload import (BLOCK_SIZE, MAX_MODEL_LEN, MAX_NUM_SEQS, NUM_BLOCKS,
                                                        TIER_MIX, TIER_SLOS, TOKEN_BUDGET)


def speed_windows(rows: list[dict], coef: np.ndarray, row_end_s: dict[int, float], t0: float,
                  window_s: float = SPEED_WINDOW_S) -> list[tuple[float, float]]:
    """The machine's measured speed as a `speed_trace` (seconds from `t0`): per window, Σ measured / Σ predicted
    (`coef`) time of the logged steps that ended in it; a window with fewer than SPEED_MIN_ROWS steps (idle, or
    steps the stamps do not show) keeps the factor before it. An oracle for diagnosis: it needs the real run."""
    x, y = step_features(rows)
    pred = x @ coef
    ends = np.array([row_end_s.get(int(r["step"]), np.nan) for r in rows]) - t0
    ok = np.isfinite(ends) & (ends >= 0)
    window = np.floor(ends[ok] / window_s).astype(int)
    measured, predicted = np.bincount(window, weights=y[ok]), np.bincount(window, weights=pred[ok])
    steps = np.bincount(window)
    trace: list[tuple[float, float]] = []
    for w in range(len(steps)):
        if steps[w] >= SPEED_MIN_ROWS and predicted[w] > 0 and (not trace or measured[w] / predicted[w] != trace[-1][1]):
            trace.append((0.0 if not trace else w * window_s, float(measured[w] / predicted[w])))
    return trace


def simulate_trace(trace: list[dict], fit_path: Path, policy: str, frontend: np.ndarray | None, seed: int = 0,
                   variability: bool = False, speed: list[tuple[float, float]] | None = None
                   ) -> tuple[list[dict], list[np.ndarray]]:
    """Simulate `trace` (arrival_s = the client's send, s from the run's start).

    `frontend` (rows of `frontend_delays` measured on a calibration run): each request draws one row (seeded,
    with replacement, the three delays of one measured request together), reaches the simulated engine `in`
    after it is sent, and sees its first and last tokens `out_first` / `out_last` after the simulated engine
    emits them; latencies are from the send. None: the engine alone. `variability`: each simulated step's
    time × a factor drawn (seeded by `seed`) from the fit file's measured/predicted ratio table. `speed`: the
    replica's `speed_trace` ((from_s, factor) pairs in the trace's time)."""
    from tierserve.core import NO_SLO, SLO
    from tierserve.sim.config import ClusterConfig, ReplicaConfig
    from tierserve.sim.simulate import simulate
    slos = [SLO(**t) if t else NO_SLO for t in TIER_SLOS]
    order = sorted(trace, key=lambda r: r["arrival_s"])
    if frontend is None:
        delays = np.zeros((len(order), 3))
    else:
        delays = frontend[np.random.default_rng(seed).integers(0, len(frontend), len(order))]
    cfg = ClusterConfig(num_replicas=1, local_policy=policy, replica=ReplicaConfig(
        block_size=BLOCK_SIZE, num_blocks=NUM_BLOCKS - 1, token_budget=TOKEN_BUDGET, max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN, exec_model_file=str(fit_path), step_time_variability=variability,
        speed_trace=speed or []))
    at_engine = sorted(range(len(order)), key=lambda k: (order[k]["arrival_s"] + delays[k, 0], k))
    reqs = [Request(k, order[k]["arrival_s"] + delays[k, 0], order[k]["prompt_tokens"], order[k]["output_tokens"],
                    order[k]["tier"], slos[order[k]["tier"]]) for k in at_engine]
    res = simulate(cfg, reqs, num_tiers=len(TIER_MIX), seed=seed)
    out = []
    for s in res.states:
        k = s.id
        sent = order[k]["arrival_s"]
        out.append({"tier": s.tier, "ttft": s.first_token_s + delays[k, 1] - sent,
                    "ttlt": s.finish_s + delays[k, 2] - sent})
    tbt = []
    for h in res.tbt_by_tier:
        vals, counts = h.items()
        tbt.append(np.repeat(np.asarray(vals, float), np.asarray(counts, int)))
    return out, tbt
