"""Niyama / QoServe (seed 003; ALGORITHMS.md §4): deadline-driven replica scheduling on Sarathi's batch.

Each iteration: every decode, plus prefill chunks chosen by priority within a budget. Four mechanisms, each
switchable (the ablation turns them on one by one):

* dynamic chunking — the batch's token total is the largest in [128, 2552] whose *predicted* iteration time
  × 1.2 fits the tightest next-token slack of the running decodes (through the predictor protocol; the
  smallest when that slack is ≤ 0; ≤ 512 while free KV is below `pressure_free_fraction`). Off: a fixed
  `chunk_tokens` (256, the shared-cluster baseline's).
* priority — `edf`: the prefill deadline; `hybrid` (paper eq. 4/5): interactive a + TTFT + α·prefill_rem,
  non-interactive a + TTLT + α·(prefill_rem + decode_rem_est), decode_rem_est = per-application mean + 2σ
  of observed decode lengths (learned online in `on_finish`); `latest_start` (the public QoServe code):
  non-interactive a + TTLT − decode_rem_est·`latest_start_tbt_s` + α·prefill_rem. α = 0 is EDF.
* eager relegation — a prefill candidate that has missed, or is estimated to miss, its first-token (TTLT)
  deadline (now + prefill_rem / prefill-throughput EWMA > deadline; EWMA from 8,500 tok/s) is relegated:
  it still runs, after every non-relegated prefill, and finishes with outcome RELEGATED. With importance
  ranks (`tier_importance`, default: all equal) the lowest tier is relegated first (seed 003: low-priority
  requests are relegated preferentially, and a violated high-priority one only when no low-priority request
  is left): a violator — one that has missed its deadline too — keeps its place and a less important
  candidate gives way instead, the least important one ahead of it in line, else (`relegation_scope`
  "queue", the default) the least important waiting one nearest the front of the line; only when no less
  important candidate is left is the violator itself relegated. `relegation_scope` "ahead" (the rule before
  issue 9's fix) looks only ahead of the violator and relegates a violator past its deadline itself.
* selective preemption — a partially prefilled request may be paused (its KV kept, its chunk given to a
  higher-priority request) only if it still meets its own deadline after the pause; off, partial prefills
  go first as in Sarathi. Decodes are never paused; under a KV shortfall partial prefills are evicted first
  and a decode only when no partial prefill is left (`forced_decode_evictions` counts those).

Skip-ahead stays exact: a decode-only batch is repeatable only when no prefill was withheld for lack of
slack (that decision changes with time), and a relegation instant is a revision point (`revise_at_s`). With
every running request decoding and nothing waiting, the plan is those decodes oldest first (`decode_batch`),
so the simulator starts their decode runs without asking.

The plan and the queues live in `NiyamaCore` (niyama_core.py, a native class when it is in the compiled set of
`tierserve/_native.py`); this class validates the parameters, declares the policy and hands the core every plan
and hook.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from tierserve.core import AllocationRule, BatchPlan, ConfigError, PreemptMode, RequestState
from tierserve.policies.local.base import LocalPolicy, ReplicaView, _hold_whole_prompt
from tierserve.policies.local.deadlines import DecodeLengthEstimator
from tierserve.policies.local.niyama_core import NiyamaCore, oldest_first
from tierserve.policies.local.sarathi_fcfs import check_chunk

PRIORITIES = ("hybrid", "edf", "latest_start")
RELEGATION_SCOPES = ("queue", "ahead")


def _positive(name: str, value, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(name, value, "a finite number >= 0" if allow_zero else "a finite number > 0")
    return float(value)


class NiyamaPolicy(LocalPolicy):
    name = "niyama"
    default_token_budget = 2552      # the top of the dynamic-chunk search space
    default_max_num_seqs = 128
    allocation = AllocationRule.WHOLE_PROMPT

    def __init__(self, dynamic_chunking: bool = True, chunk_tokens: int = 256, min_chunk_tokens: int = 128,
                 max_chunk_tokens: int = 2552, pressure_chunk_tokens: int = 512,
                 pressure_free_fraction: float = 0.1, slack_factor: float = 1.2, priority: str = "hybrid",
                 alpha_s_per_token: float = 0.008, eager_relegation: bool = True,
                 selective_preemption: bool = True, tier_importance: Sequence[int] | None = None,
                 prefill_throughput_tok_s: float = 8500.0, throughput_ewma_weight: float = 0.2,
                 decode_sigmas: float = 2.0, decode_prior_tokens: float = 256.0,
                 latest_start_tbt_s: float = 0.05, relegation_scope: str = "queue") -> None:
        for name, v in (("dynamic_chunking", dynamic_chunking), ("eager_relegation", eager_relegation),
                        ("selective_preemption", selective_preemption)):
            if not isinstance(v, bool):
                raise ConfigError(name, v, "true | false")
        if priority not in PRIORITIES:
            raise ConfigError("priority", priority, " | ".join(PRIORITIES))
        chunk = check_chunk("chunk_tokens", chunk_tokens)
        min_chunk = check_chunk("min_chunk_tokens", min_chunk_tokens)
        max_chunk = check_chunk("max_chunk_tokens", max_chunk_tokens)
        if max_chunk < min_chunk:
            raise ConfigError("max_chunk_tokens", max_chunk_tokens, f">= min_chunk_tokens ({min_chunk_tokens})")
        pressure_chunk = check_chunk("pressure_chunk_tokens", pressure_chunk_tokens)
        pressure_fraction = _positive("pressure_free_fraction", pressure_free_fraction, allow_zero=True)
        if pressure_fraction >= 1:
            raise ConfigError("pressure_free_fraction", pressure_free_fraction, "a fraction in [0, 1)")
        ranks: tuple[int, ...] | None = None
        if tier_importance is not None:
            if isinstance(tier_importance, (str, bytes)) or not isinstance(tier_importance, Sequence) or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in tier_importance):
                raise ConfigError("tier_importance", tier_importance,
                                  "a list of integer ranks >= 0, one per tier (0 = most important)")
            ranks = tuple(tier_importance)
        if relegation_scope not in RELEGATION_SCOPES:
            raise ConfigError("relegation_scope", relegation_scope, " | ".join(RELEGATION_SCOPES))
        slack_factor_checked = _positive("slack_factor", slack_factor)
        alpha = _positive("alpha_s_per_token", alpha_s_per_token, allow_zero=True)
        tput = _positive("prefill_throughput_tok_s", prefill_throughput_tok_s)
        w = _positive("throughput_ewma_weight", throughput_ewma_weight)
        if w > 1:
            raise ConfigError("throughput_ewma_weight", throughput_ewma_weight, "a weight in (0, 1]")
        latest_start = _positive("latest_start_tbt_s", latest_start_tbt_s)
        lengths = DecodeLengthEstimator(_positive("decode_sigmas", decode_sigmas, allow_zero=True),
                                        _positive("decode_prior_tokens", decode_prior_tokens))
        self.uses_predictor = dynamic_chunking     # the chunk is sized by the predicted iteration time
        self.core = NiyamaCore(
            self.blocks_to_hold, type(self).blocks_to_hold is _hold_whole_prompt, dynamic_chunking, chunk,
            min_chunk, max_chunk, pressure_chunk, pressure_fraction, slack_factor_checked, priority, alpha,
            eager_relegation, selective_preemption, ranks, relegation_scope, tput, w, latest_start, lengths)

    # The parameters and the state live on the core; these read them there.
    dynamic_chunking = property(lambda self: self.core.dynamic_chunking)
    chunk_tokens = property(lambda self: self.core.chunk_tokens)
    min_chunk_tokens = property(lambda self: self.core.min_chunk_tokens)
    max_chunk_tokens = property(lambda self: self.core.max_chunk_tokens)
    pressure_chunk_tokens = property(lambda self: self.core.pressure_chunk_tokens)
    pressure_free_fraction = property(lambda self: self.core.pressure_free_fraction)
    slack_factor = property(lambda self: self.core.slack_factor)
    priority = property(lambda self: self.core.priority)
    alpha = property(lambda self: self.core.alpha)
    eager_relegation = property(lambda self: self.core.eager_relegation)
    selective_preemption = property(lambda self: self.core.selective_preemption)
    tier_importance = property(lambda self: self.core.tier_importance)
    relegation_scope = property(lambda self: self.core.relegation_scope)
    ewma_weight = property(lambda self: self.core.ewma_weight)
    latest_start_tbt_s = property(lambda self: self.core.latest_start_tbt_s)
    decode_lengths = property(lambda self: self.core.decode_lengths)
    prefill_tput = property(lambda self: self.core.prefill_tput, doc="prefill tokens/s (EWMA of the measured)")
    forced_decode_evictions = property(lambda self: self.core.forced_decode_evictions,
                                       doc="decodes evicted for KV when no partial prefill was left")
    pauses = property(lambda self: self.core.pauses,
                      doc="partial prefills passed over for a higher-priority request")

    # The plan calls the core's own versions of these: an override here would be silently ignored.
    _CORE_DECISIONS = ("importance", "priority_value", "relegate_at", "batch_tokens")

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        overridden = [name for name in NiyamaPolicy._CORE_DECISIONS if name in vars(cls)]
        if overridden:
            raise TypeError(f"{cls.__name__} overrides {', '.join(overridden)} of NiyamaPolicy: its plan runs on "
                            f"NiyamaCore (niyama_core.py) and would not call them; override `plan` instead")

    # ----- priorities -----
    def importance(self, state: RequestState) -> int:
        return self.core.importance(state)

    def priority_value(self, state: RequestState) -> float:
        """Smaller is served first (paper eq. 4/5, or EDF, or the public code's latest-start form)."""
        return self.core.priority_value(state)

    def relegate_at(self, state: RequestState) -> float:
        """The instant after which the candidate is estimated to miss its prefill deadline."""
        return self.core.relegate_at(state)

    # ----- dynamic chunking -----
    def batch_tokens(self, view: ReplicaView, decodes: Sequence[RequestState], free_blocks: int,
                     head: RequestState | None) -> int:
        """Token total of this iteration (decodes included)."""
        return self.core.batch_tokens(view, decodes, free_blocks, head)

    # ----- the batch -----
    def decode_batch(self, running: Sequence[RequestState]) -> list[RequestState] | None:
        # Every running request decoding, their blocks fitting and nothing waiting: `plan` schedules them
        # oldest first and finds no prefill candidate (nothing to relegate, withhold or revise at).
        if getattr(self.plan, "__func__", None) is not NiyamaPolicy.plan:
            return None
        return oldest_first(running)

    def plan(self, view: ReplicaView) -> BatchPlan:
        return self.core.plan(view)

    # ----- hooks -----
    def on_arrival(self, state: RequestState, view: ReplicaView) -> None:
        self.core.enqueue(state)

    def on_preempt(self, state: RequestState, mode: PreemptMode, view: ReplicaView) -> None:
        self.core.enqueue(state)

    def on_relegate(self, state: RequestState, view: ReplicaView) -> None:
        self.core.on_relegate(state)

    def on_iteration_end(self, batch: Sequence[RequestState], num_iterations: int, elapsed_s: float,
                         view: ReplicaView) -> None:
        self.core.on_iteration_end(num_iterations, elapsed_s)

    def on_finish(self, state: RequestState, view: ReplicaView) -> None:
        self.core.decode_lengths.observe(state)
