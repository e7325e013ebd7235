# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""The execution-time model's per-iteration part (tables, `iteration_time`, the chunk bisection), apart from
its builders so that it can be compiled with the simulator's hot path (tierserve/_native.py): every iteration,
every deadline_slack dispatch (64 pricings on 64 replicas) and every Niyama chunk search calls it.
`tierserve.hardware.exec_model` builds the models and re-exports these names."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tierserve.core.errors import ConfigError


def prefill_attention_pairs(chunk: int, context_before: int) -> float:
    """Causal (query, key) pairs of a prefill chunk after `context_before` cached tokens: chunk·(ctx + chunk/2)."""
    return chunk * (context_before + chunk * 0.5)


class _Table:
    """f(n) for integer n ≥ 0: a list up to its end, linear extrapolation beyond; f(0) = 0."""

    __slots__ = ("values", "array", "last", "end", "slope")

    def __init__(self, values: np.ndarray) -> None:
        self.array = np.asarray(values, dtype=float)
        self.values: list[float] = self.array.tolist()
        self.end = len(self.values) - 1
        self.last = self.values[-1]
        self.slope = (self.values[-1] - self.values[-65]) / 64.0   # average over the last 64 steps

    def at(self, n: int) -> float:
        if n <= self.end:
            return self.values[n]
        return self.last + self.slope * (n - self.end)

    def many(self, n: np.ndarray) -> np.ndarray:
        c = np.minimum(n, self.end)
        return self.array[c] + self.slope * (n - c)


class ExecutionTimeModel:
    """Iteration time in seconds of the whole model (all layers) for one batch shape."""

    def __init__(self, name: str, token_s: np.ndarray, prefill_s: np.ndarray, decode_s: np.ndarray,
                 pair_coef_s: float, decode_context_coef_s: float, notes: Sequence[str] = (),
                 kv_write_s: np.ndarray | None = None) -> None:
        """kv_write_s: KV-write seconds by the batch's total tokens P + B (Vidur's pooled curve), added to
        token_s; kept apart only so `breakdown` can report it."""
        tables = [("token_s", token_s), ("prefill_s", prefill_s), ("decode_s", decode_s)]
        if kv_write_s is not None:
            tables.append(("kv_write_s", kv_write_s))
        for label, arr in tables:
            if len(arr) < 66 or arr[0] != 0.0:
                raise ConfigError(label, len(arr), "a table of ≥ 66 entries starting at 0.0")
        self.name = name
        self.notes = tuple(notes)
        self._kvw = None if kv_write_s is None else _Table(kv_write_s)
        if kv_write_s is not None:
            if len(kv_write_s) != len(token_s):
                raise ConfigError("kv_write_s", len(kv_write_s), f"a table as long as token_s ({len(token_s)})")
            token_s = np.asarray(token_s, dtype=float) + np.asarray(kv_write_s, dtype=float)
        self._tok = _Table(token_s)
        self._pre = _Table(prefill_s)
        self._dec = _Table(decode_s)
        self.pair_coef_s = float(pair_coef_s)
        self.decode_context_coef_s = float(decode_context_coef_s)
        n = min(self._tok.end, self._dec.end)
        self._base = (self._tok.array[: n + 1] + self._dec.array[: n + 1]).tolist()

    def __repr__(self) -> str:
        return f"ExecutionTimeModel({self.name!r})"

    def decode_base_time(self, decode_count: int) -> float:
        """Seconds for B decodes with zero context: iteration_time(0, 0, B, 0)."""
        if decode_count < len(self._base):
            return self._base[decode_count]
        return self._tok.at(decode_count) + self._dec.at(decode_count)

    def iteration_time(self, prefill_tokens: int, prefill_attn_pairs: float, decode_count: int,
                       decode_context_sum: int) -> float:
        if not prefill_tokens:
            b = self._base
            base = b[decode_count] if decode_count < len(b) else self._tok.at(decode_count) + self._dec.at(decode_count)
            return base + self.decode_context_coef_s * decode_context_sum
        t = (self._tok.at(prefill_tokens + decode_count) + self._pre.at(prefill_tokens)
             + self.pair_coef_s * prefill_attn_pairs)
        if decode_count:
            t += self._dec.at(decode_count) + self.decode_context_coef_s * decode_context_sum
        return t

    def predict_many(self, prefill_tokens, prefill_attn_pairs, decode_count, decode_context_sum) -> np.ndarray:
        p = np.asarray(prefill_tokens, dtype=np.int64)
        b = np.asarray(decode_count, dtype=np.int64)
        return (self._tok.many(p + b) + self._pre.many(p) + self._dec.many(b)
                + self.pair_coef_s * np.asarray(prefill_attn_pairs, dtype=float)
                + self.decode_context_coef_s * np.asarray(decode_context_sum, dtype=float))

    def max_prefill_tokens_within(self, slack_s: float, decode_count: int, decode_context_sum: int,
                                  prefill_context: int = 0, lo: int = 0, hi: int = 8192) -> int:
        """Largest prefill chunk p in [lo, hi] whose iteration fits in `slack_s` (bisection: time is monotone in p,
        except in vidur_parity mode, where Vidur's pooled KV-write curve dips by up to ~2 ms between profiled
        counts; there the chunk found always fits but may not be the largest that does).

        Returns `lo` when even `lo` does not fit (0 = run no prefill this iteration).
        """
        if hi <= lo or not self._fits(lo + 1, slack_s, decode_count, decode_context_sum, prefill_context):
            return lo
        if self._fits(hi, slack_s, decode_count, decode_context_sum, prefill_context):
            return hi
        good, bad = lo + 1, hi
        while bad - good > 1:
            mid = (good + bad) >> 1
            if self._fits(mid, slack_s, decode_count, decode_context_sum, prefill_context):
                good = mid
            else:
                bad = mid
        return good

    def _fits(self, p: int, slack_s: float, decode_count: int, decode_context_sum: int, prefill_context: int) -> bool:
        return self.iteration_time(p, p * (prefill_context + p * 0.5), decode_count, decode_context_sum) <= slack_s

    def breakdown(self, prefill_tokens: int, prefill_attn_pairs: float, decode_count: int,
                  decode_context_sum: int) -> dict[str, float]:
        """Seconds by term, for reports (same sum as iteration_time)."""
        p, b = prefill_tokens, decode_count
        kvw = self._kvw.at(p + b) if self._kvw is not None and p + b else 0.0
        return {
            "token_linear": self._tok.at(p + b) - kvw if p + b else 0.0,
            "kv_write": kvw,
            "prefill_fixed": self._pre.at(p) if p else 0.0,
            "prefill_pairs": self.pair_coef_s * prefill_attn_pairs if p else 0.0,
            "decode_fixed": self._dec.at(b) if b else 0.0,
            "decode_context": self.decode_context_coef_s * decode_context_sum,
        }
