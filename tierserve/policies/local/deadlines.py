# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""QoS classes and per-request deadlines (Niyama/QoServe, seed 003 §QoS classes; ALGORITHMS.md §4).

A request's `SLO` names its QoS class:
  * interactive — TTFT and TBT targets: D_first = a + TTFT, the n-th token D_n = a + TTFT + (n−1)·TBT;
  * non-interactive — a TTLT target only: D_total = a + TTLT.
When the first token came late, the following tokens' deadlines run from the actual first token (as the
public QoServe code does): D_n = max(t_first, a + TTFT) + (n−1)·TBT, so one late prefill does not doom
every later token.

Everything here reads only `state.slo` and timestamps; the policies (`sarathi_edf`, `niyama`) and their
tests share it. No true output length is read: the remaining-decode estimate is `DecodeLengthEstimator`,
learned online from finished requests.
"""
from __future__ import annotations

import math
from typing import cast

from tierserve.core import SLO, ConfigError, RequestState

INTERACTIVE, NON_INTERACTIVE = "interactive", "non_interactive"
QOS_CLASSES = (INTERACTIVE, NON_INTERACTIVE)


def qos_class(slo: SLO) -> str:
    """The QoS class an SLO declares; ConfigError for one that is neither (or half of interactive)."""
    if slo.ttft_s is not None or slo.tbt_s is not None:
        if slo.ttft_s is None or slo.tbt_s is None:
            raise ConfigError("slo", slo, "an interactive SLO with both ttft_s and tbt_s (Niyama QoS class)")
        return INTERACTIVE
    if slo.ttlt_s is not None:
        return NON_INTERACTIVE
    raise ConfigError("slo", slo, "a QoS class: ttft_s + tbt_s (interactive) or ttlt_s (non-interactive)")


def check_qos_class(name: str) -> str:
    if name not in QOS_CLASSES:
        raise ConfigError("qos_class", name, " | ".join(QOS_CLASSES))
    return name


def first_token_deadline(state: RequestState) -> float:
    """a + TTFT (interactive); a + TTLT (non-interactive: its only deadline also bounds the first token)."""
    slo = state.slo
    if slo.ttft_s is not None:
        return state.arrival_s + slo.ttft_s
    return completion_deadline(state)


def completion_deadline(state: RequestState) -> float:
    """a + TTLT (inf for an interactive request, whose per-token deadlines bound it instead)."""
    t = state.slo.ttlt_s
    return state.arrival_s + t if t is not None else math.inf


def token_deadline(state: RequestState, n: int) -> float:
    """Deadline of the n-th output token (n ≥ 1) of an interactive request; late-prefill rule after token 1."""
    slo = state.slo
    d_first = state.arrival_s + cast(float, slo.ttft_s)     # cast: None (not interactive) is a TypeError
    if n <= 1:
        return d_first
    base = state.first_token_s if state.first_token_s > d_first else d_first
    return base + (n - 1) * cast(float, slo.tbt_s)


def next_token_deadline(state: RequestState) -> float:
    """Deadline of the token this request produces next (its first while it has produced none)."""
    if state.slo.tbt_s is None:
        return completion_deadline(state)
    return token_deadline(state, state.num_generated + 1)


def prefill_deadline(state: RequestState) -> float:
    """What a request in prefill races against: its first token's deadline (or, when a recompute refills a
    request that already produced tokens, its next token's)."""
    if state.num_generated > 0:
        return next_token_deadline(state)
    return first_token_deadline(state)


def decode_slack_s(state: RequestState, now: float, decode_remaining_est: float) -> float:
    """Seconds the next iteration may take before this decoding request misses.

    Interactive: the next token's deadline − now. Non-interactive: the time left to its TTLT spread evenly
    over the tokens it is estimated to still produce (its deadline is on the last token, not the next).
    """
    if state.slo.tbt_s is not None:
        return next_token_deadline(state) - now
    left = completion_deadline(state) - now
    return left / decode_remaining_est if left > 0 else left


_TIER_KEYS = tuple(f"tier{t}" for t in range(64))     # an app-less request's estimator key, by tier


class DecodeLengthEstimator:
    """Per-application decode length, learned online: estimate = mean + k·σ of observed lengths (Niyama §
    hybrid prioritisation: "2 standard deviations above" the application's history).

    Requests with no `app` are keyed by tier. Before `min_samples` observations the prior is used.
    """

    __slots__ = ("sigmas", "prior_tokens", "min_samples", "_stats", "_totals")

    def __init__(self, sigmas: float = 2.0, prior_tokens: float = 256.0, min_samples: int = 2) -> None:
        if not (math.isfinite(sigmas) and sigmas >= 0):
            raise ConfigError("decode_sigmas", sigmas, "a finite number >= 0")
        if not (math.isfinite(prior_tokens) and prior_tokens >= 1):
            raise ConfigError("decode_prior_tokens", prior_tokens, "a finite number >= 1")
        self.sigmas = sigmas
        self.prior_tokens = prior_tokens
        self.min_samples = min_samples
        self._stats: dict[str, list[float]] = {}     # key -> [count, mean, M2] (Welford)
        self._totals: dict[str, float] = {}          # key -> total_tokens, until its next observation

    @staticmethod
    def key(state: RequestState) -> str:
        app = state.app
        if app:
            return app
        tier = state.tier
        return _TIER_KEYS[tier] if 0 <= tier < len(_TIER_KEYS) else f"tier{tier}"

    def observe(self, state: RequestState) -> None:
        """A request finished having produced `num_generated` tokens (observed, not the oracle)."""
        key = self.key(state)
        self._totals.pop(key, None)
        s = self._stats.setdefault(key, [0.0, 0.0, 0.0])
        x = float(state.num_generated)
        s[0] += 1.0
        d = x - s[1]
        s[1] += d / s[0]
        s[2] += d * (x - s[1])

    def total_tokens(self, state: RequestState) -> float:
        key = self.key(state)
        total = self._totals.get(key)
        if total is None:           # computed once per observation of its key (plans ask for it per decode)
            s = self._stats.get(key)
            if s is None or s[0] < self.min_samples:
                total = self.prior_tokens
            else:
                total = s[1] + self.sigmas * math.sqrt(s[2] / (s[0] - 1.0))
            self._totals[key] = total
        return total

    def remaining(self, state: RequestState) -> float:
        """Estimated tokens still to produce (at least 1 while unfinished)."""
        r = self.total_tokens(state) - state.num_generated
        return r if r > 1.0 else 1.0
