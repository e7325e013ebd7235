"""UniBoost (seed 001): prediction-free, tail-aware replica scheduling by γ-Boost, in four phases
(ALGORITHMS.md §3; derivations in reference/tail-scheduling-theory.md).

Score of request i: Φ_i = a_i − b_γ(τ·w̃_i) (+ its tier's offset), served smallest first, where a_i is the
arrival time (s), w̃_i = max(w_i, s_i^pre) the attained work in tokens (prompt computed once + tokens
generated; never reset by preemption) floored at the prompt, τ the GPU seconds per token, and b_γ the boost:
`closed_form` = the known-size γ-Boost b_γ(s) = −log(−expm1(−γs))/γ of the seed's score, or `attained` = the
unknown-size boost from attained service (Harlev, Yu & Scully) for the empirical distribution of the sizes of
requests finished here, tabulated at MemGuard's bin edges and refreshed every `ada_every` completions.

Phases (`phases`, any subset of PHASES; the registry names fix the ablation's sets):
  * without "unified" — DistBoost (phase 1): decodes first, ordered by Φ; prefill chunks piggyback on what is
    left of the budget, ordered by Φ (of the known prompt);
  * "unified" — UniBoost-Base (phase 2): one priority space over prefill and decode, preempting across phases;
  * "memguard" — MemGuard (phase 3): the decode part of w̃ only counts at geometric thresholds k, 2k, 4k, …
    (absolute, never reset on resume), so a request's priority is revised at most 1 + ⌊log2(S/k)⌋ times; after
    dispatch or resume it cannot be evicted for priority until it crosses its next threshold and has run δ
    tokens; victims are evicted worst key first, each by the cheaper of swap (out + in) and recompute.
  * "gamma_ada" — γ-Ada (phase 4): γ tracks load as the decay rate of the FCFS waiting-time tail, the root of
    λ(E[e^{γS}] − 1) = γ over a window of arrivals and finished sizes (S = the request's share of the GPU
    time of every iteration it ran in, split by the tokens each request ran; λE[S] is then the replica's
    busy fraction), recomputed at a
    completion once `ada_every` completions and `ada_period_s` seconds have passed, smoothed in log domain
    (β), clipped to [gamma_min, gamma_max], gamma_min when λE[S] ≥ 0.98. `gamma_rule="nudge"` is the seed
    code's alternative: move γ toward gamma_max/(1 + 4·max(p99/p95 − 1, 0)) of the window's TTLTs.
Tiers (not in the seed): `tier_mode="offset"` adds the tier's TTFT target (s) to Φ — a tier with a tighter
target gets that much head start (`tier_offsets_s` overrides, one per tier); "strict" orders by tier first,
then Φ; "none" ignores tiers.

γ changes and the boost table refreshes only at completions, and MemGuard keys only at thresholds, so every
key is constant between the revision points the plan declares: skip-ahead stays exact.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from tierserve.core import ConfigError, PreemptMode, RequestState
from tierserve.policies.local.base import ReplicaView
from tierserve.policies.local.boost import (attained_boost, check_gamma, empirical_mgf, fcfs_tail_decay_rate,
                                            known_size_boost)
from tierserve.policies.local.priority import NEVER, PriorityLoopPolicy

PHASES = ("unified", "memguard", "gamma_ada")
BOOSTS = ("closed_form", "attained")
TIER_MODES = ("offset", "strict", "none")
GAMMA_RULES = ("fcfs_tail", "nudge")
UNTARGETED_OFFSET_S = 60.0      # a tier with no TTFT target ranks as if its target were a minute


def memguard_threshold_below(generated: int, k: int) -> int:
    """Largest threshold k·2^m ≤ generated (0 below k): the decode work MemGuard lets the key see."""
    if generated < k:
        return 0
    return k << ((generated // k).bit_length() - 1)


def memguard_next_threshold(generated: int, k: int) -> int:
    """Smallest threshold k·2^m > generated."""
    if generated < k:
        return k
    return k << (generated // k).bit_length()


def revision_bound(decode_tokens: int, k: int) -> int:
    """1 + ⌊log2(S/k)⌋ for S ≥ k, else 0: the thresholds a request of S decode tokens crosses."""
    return (decode_tokens // k).bit_length() if decode_tokens >= k else 0


def parse_phases(phases: Sequence[str] | str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    if phases is None:
        return default
    items = [p.strip() for p in phases.split(",") if p.strip()] if isinstance(phases, str) else list(phases)
    for p in items:
        if p not in PHASES:
            raise ConfigError("phases", phases, f"a subset of {', '.join(PHASES)} (without 'unified': DistBoost)")
    return tuple(p for p in PHASES if p in items)


class UniBoostPolicy(PriorityLoopPolicy):
    name = "uniboost"
    default_phases: tuple[str, ...] = PHASES

    def __init__(self, phases: Sequence[str] | str | None = None, gamma: float = 1.0, k: int = 256,
                 delta: int = 32, boost: str = "closed_form", tier_mode: str = "offset",
                 tier_offsets_s: Sequence[float] | None = None, seconds_per_token: float | None = None,
                 gamma_min: float = 0.01, gamma_max: float = 100.0, gamma_rule: str = "fcfs_tail",
                 ada_window: int = 2000, ada_min_samples: int = 200, ada_every: int = 100,
                 ada_period_s: float = 5.0, ada_beta: float = 0.3, **kwargs) -> None:
        super().__init__(**kwargs)
        self.phases = parse_phases(phases, self.default_phases)
        self.unified = "unified" in self.phases
        self.memguard = "memguard" in self.phases
        self.gamma_ada = "gamma_ada" in self.phases
        self.gamma = check_gamma(gamma)
        self.gamma_min = check_gamma(gamma_min, "gamma_min")
        self.gamma_max = check_gamma(gamma_max, "gamma_max")
        if self.gamma_min > self.gamma_max:
            raise ConfigError("gamma_min", gamma_min, f"at most gamma_max ({gamma_max})")
        if not (isinstance(k, int) and k >= 1):
            raise ConfigError("k", k, "an integer >= 1 (tokens to the first MemGuard threshold)")
        if not (isinstance(delta, int) and delta >= 0):
            raise ConfigError("delta", delta, "an integer >= 0 (tokens of hysteresis)")
        for field, value, allowed in (("boost", boost, BOOSTS), ("tier_mode", tier_mode, TIER_MODES),
                                      ("gamma_rule", gamma_rule, GAMMA_RULES)):
            if value not in allowed:
                raise ConfigError(field, value, " | ".join(allowed))
        if seconds_per_token is not None and not (math.isfinite(seconds_per_token) and seconds_per_token > 0):
            raise ConfigError("seconds_per_token", seconds_per_token, "a positive number of seconds, or null")
        for field, v in (("ada_window", ada_window), ("ada_min_samples", ada_min_samples), ("ada_every", ada_every)):
            if not (isinstance(v, int) and v >= 1):
                raise ConfigError(field, v, "an integer >= 1")
        if not (0 < ada_beta <= 1):
            raise ConfigError("ada_beta", ada_beta, "a smoothing weight in (0, 1]")
        if not (ada_period_s >= 0):
            raise ConfigError("ada_period_s", ada_period_s, "seconds >= 0")
        self.k, self.delta, self.boost, self.tier_mode = k, delta, boost, tier_mode
        self.tier_offsets_s = tuple(float(x) for x in tier_offsets_s) if tier_offsets_s is not None else None
        self.tau = seconds_per_token
        self.uses_predictor = seconds_per_token is None or self.memguard    # τ from the model; MemGuard's victims
        self.gamma_rule = gamma_rule
        self.ada_min_samples, self.ada_every, self.ada_period_s, self.ada_beta = (
            ada_min_samples, ada_every, float(ada_period_s), float(ada_beta))
        self._arrivals: deque[float] = deque(maxlen=ada_window)
        # finished requests' sizes S for γ-Ada: GPU-time share in seconds (ALGORITHMS.md §3), summed from
        # every iteration a request took part in, split by the tokens each request ran in it
        self._sizes: deque[float] = deque(maxlen=ada_window)
        self._work_s: deque[float] = deque(maxlen=ada_window)      # τ·attained tokens, for the attained boost
        self._track_share = self.gamma_ada and gamma_rule == "fcfs_tail"
        self._ttlt: deque[float] = deque(maxlen=ada_window)
        self._since_update = 0
        self._last_update_s = -math.inf
        self._table: np.ndarray | None = None                     # sorted sizes for the attained boost
        self._table_memo: dict[int, float] = {}
        self._since_table = 0
        self.gamma_history: list[tuple[float, float]] = [(0.0, self.gamma)]
        # what γ-Ada saw at its last update: λ·E[S] (the window's load) and the root it aimed for
        self.last_load = math.nan
        self.last_target = math.nan

    # ----- work and boost -----
    def _bind(self, view: ReplicaView) -> None:
        if self.tau is None:
            b = view.token_budget
            self.tau = view.predictor.iteration_time(b, b * b * 0.5, 0, 0) / b   # GPU seconds per token at full batch

    def work_tokens(self, s: RequestState, extra: int = 0) -> int:
        """w̃ in tokens, as the key sees it (MemGuard and the attained boost quantise the decode part)."""
        g = s.num_generated + extra
        if self.memguard or self.boost == "attained":
            g = memguard_threshold_below(g, self.k)
        return s.prompt_tokens + g

    def boost_s(self, work_tokens: int) -> float:
        if self.boost == "attained" and self._table is not None:
            b = self._table_memo.get(work_tokens)
            if b is None:
                b = self._table_memo[work_tokens] = attained_boost(self._table, self.tau * work_tokens, self.gamma)
            return b
        return known_size_boost(self.tau * work_tokens, self.gamma)

    def tier_offset_s(self, s: RequestState) -> float:
        if self.tier_offsets_s is not None:
            return self.tier_offsets_s[s.tier] if s.tier < len(self.tier_offsets_s) else self.tier_offsets_s[-1]
        t = s.slo.ttft_s
        return t if t is not None else UNTARGETED_OFFSET_S

    def score(self, s: RequestState, extra: int = 0) -> tuple:
        phi = s.arrival_s - self.boost_s(self.work_tokens(s, extra))
        if self.tier_mode == "offset":
            head = (phi + self.tier_offset_s(s),)
        elif self.tier_mode == "strict":
            head = (s.tier, phi)
        else:
            head = (phi,)
        if not self.unified:    # DistBoost: the decode queue first, prefill chunks piggyback
            decoding = s.num_generated > 0 and s.num_tokens - s.num_computed_tokens == 1
            return (0 if decoding else 1, *head)
        return head

    def key(self, s: RequestState) -> tuple:
        return self.score(s)

    def key_after(self, s: RequestState, j: int) -> tuple:
        return self.score(s, j)

    # ----- MemGuard -----
    def on_dispatch(self, r: RequestState) -> None:
        d = r.policy_data
        d["mg_resume_gen"] = r.num_generated
        d["mg_next_threshold"] = memguard_next_threshold(r.num_generated, self.k)

    def _protected_for(self, s: RequestState) -> int:
        """Decode tokens until `s` may be evicted for priority (0: now)."""
        d = s.policy_data
        g = s.num_generated
        left = max(d.get("mg_next_threshold", 0) - g, d.get("mg_resume_gen", g) + self.delta - g)
        return max(left, 0)

    def evictable(self, victim: RequestState, by: RequestState) -> bool:
        return not self.memguard or self._protected_for(victim) == 0

    def token_horizon(self, scheduled: list[RequestState]) -> int:
        if not self.memguard:
            return NEVER
        k = NEVER
        for s in scheduled:
            left = self._protected_for(s)
            if 0 < left < k:
                k = left
        return k

    def victim_mode(self, victim: RequestState, view: ReplicaView) -> PreemptMode:
        if not self.memguard:
            return self._mode
        swap = 2.0 * view.swap_time_s(victim.num_blocks)               # out now, back in on resume
        recompute = view.recompute_time_s(victim.num_computed_tokens)
        return PreemptMode.SWAP if swap < recompute else PreemptMode.RECOMPUTE

    # ----- hooks: the online statistics γ-Ada and the attained boost read -----
    def plan(self, view: ReplicaView):
        self._bind(view)
        return super().plan(view)

    def on_arrival(self, state: RequestState, view: ReplicaView) -> None:
        self._bind(view)
        self._arrivals.append(view.now)

    def on_iteration_end(self, batch: Sequence[RequestState], num_iterations: int, elapsed_s: float,
                         view: ReplicaView) -> None:
        if not self._track_share:
            return
        # service_tokens only grows, so its change since the last iteration seen is what each ran in this one
        ran = [s.service_tokens - s.policy_data.get("ub_service_tokens", 0) for s in batch]
        total = sum(ran)
        if total <= 0:
            return
        per_token_s = elapsed_s / total
        for s, n in zip(batch, ran):
            d = s.policy_data
            d["ub_gpu_share_s"] = d.get("ub_gpu_share_s", 0.0) + n * per_token_s
            d["ub_service_tokens"] = s.service_tokens

    @staticmethod
    def finished_gpu_share_s(state: RequestState) -> float:
        """γ-Ada's S for a finished request: its share of the GPU time of the iterations it ran in.

        Rounded to 0.1 µs: a decode run sums its iterations' times before splitting them, stepping splits each,
        and the two differ in the last bits; rounding makes γ the same either way (skip-ahead stays exact
        unless a sum falls within a few ulps of a rounding edge, ~1e-10 per request).
        """
        d = state.policy_data
        d.pop("ub_service_tokens", None)
        share = d["gpu_share_s"] = round(d.pop("ub_gpu_share_s", 0.0), 7)
        return share

    def on_finish(self, state: RequestState, view: ReplicaView) -> None:
        now = view.now
        self._sizes.append(self.finished_gpu_share_s(state) if self._track_share
                           else self.tau * state.attained_tokens)
        self._work_s.append(self.tau * state.attained_tokens)
        self._ttlt.append(now - state.arrival_s)
        self._since_update += 1
        self._since_table += 1
        if self.boost == "attained" and self._since_table >= self.ada_every and len(self._work_s) >= 50:
            self._table = np.sort(np.fromiter(self._work_s, float))
            self._table_memo.clear()
            self._since_table = 0
        if (self.gamma_ada and self._since_update >= self.ada_every and now - self._last_update_s >= self.ada_period_s
                and len(self._sizes) >= self.ada_min_samples and len(self._arrivals) >= 2):
            self._update_gamma(now)
        # γ and γ-Ada's load estimate as of this completion, so a run's γ over time can be read from its requests
        state.policy_data["gamma"] = self.gamma
        state.policy_data["gamma_load"] = self.last_load

    def _update_gamma(self, now: float) -> None:
        self._since_update = 0
        self._last_update_s = now
        if self.gamma_rule == "nudge":
            p95, p99 = np.percentile(np.fromiter(self._ttlt, float), [95, 99])
            target = self.gamma_max / (1.0 + 4.0 * max(p99 / p95 - 1.0, 0.0)) if p95 > 0 else self.gamma_max
        else:
            a = self._arrivals
            span = a[-1] - a[0]
            lam = (len(a) - 1) / span if span > 0 else math.inf
            sizes = np.fromiter(self._sizes, float)
            mean = float(sizes.mean())
            self.last_load = lam * mean
            if lam * mean >= 0.98:
                target = self.gamma_min
            else:
                target = fcfs_tail_decay_rate(lam, empirical_mgf(sizes), mean)
                if not (target > 0):
                    target = self.gamma_min
        self.last_target = target
        g = math.exp((1.0 - self.ada_beta) * math.log(self.gamma) + self.ada_beta * math.log(target))
        self.gamma = min(max(g, self.gamma_min), self.gamma_max)
        self._table_memo.clear()
        self.gamma_history.append((now, self.gamma))


class UniBoostBasePolicy(UniBoostPolicy):
    name = "uniboost_base"
    default_phases = ("unified",)


class UniBoostMemGuardPolicy(UniBoostPolicy):
    name = "uniboost_memguard"
    default_phases = ("unified", "memguard")
