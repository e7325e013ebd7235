"""The execution-time predictor a policy may ask inside an engine: the linear fit `tierserve calibrate
--iterations` makes from this engine's own iteration log (DESIGN.md's t = c0 + c1·P + c2·B + c3·pairs + c4·C)."""
from __future__ import annotations

import json
from pathlib import Path

from tierserve.core import ConfigError

LINEAR_FIT_KEYS = ("c0_s", "c_prefill_tok_s", "c_decode_tok_s", "c_pair_s", "c_ctx_s")


class LinearPredictor:
    """`IterationPredictor` over the five linear coefficients (seconds)."""

    def __init__(self, c0_s: float, c_prefill_tok_s: float, c_decode_tok_s: float, c_pair_s: float,
                 c_ctx_s: float) -> None:
        self.c0_s, self.c_prefill_tok_s, self.c_decode_tok_s = c0_s, c_prefill_tok_s, c_decode_tok_s
        self.c_pair_s = c_pair_s
        self.decode_context_coef_s = c_ctx_s

    @classmethod
    def from_file(cls, path: str | Path) -> "LinearPredictor":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError("tierserve.exec_model_file", str(path), f"a readable JSON fit ({exc})") from None
        missing = [k for k in LINEAR_FIT_KEYS if not isinstance(data.get(k), (int, float))]
        if missing:
            raise ConfigError("tierserve.exec_model_file", str(path),
                              f"the linear fit `tierserve calibrate --iterations` writes for a log without "
                              f"model/gpu columns (missing {', '.join(missing)})")
        return cls(*(float(data[k]) for k in LINEAR_FIT_KEYS))

    def iteration_time(self, prefill_tokens: int, prefill_attn_pairs: float, decode_count: int,
                       decode_context_sum: int) -> float:
        if prefill_tokens <= 0 and decode_count <= 0:
            return 0.0
        return (self.c0_s + self.c_prefill_tok_s * prefill_tokens + self.c_decode_tok_s * decode_count
                + self.c_pair_s * prefill_attn_pairs + self.decode_context_coef_s * decode_context_sum)

    def decode_base_time(self, decode_count: int) -> float:
        return self.iteration_time(0, 0.0, decode_count, 0)

    def max_prefill_tokens_within(self, slack_s: float, decode_count: int, decode_context_sum: int,
                                  prefill_context: int = 0, lo: int = 0, hi: int = 8192) -> int:
        def fits(p: int) -> bool:
            pairs = p * (prefill_context + p * 0.5)
            return self.iteration_time(p, pairs, decode_count, decode_context_sum) <= slack_s
        if not fits(lo):
            return lo
        while lo < hi:                      # time grows with p: bisect for the largest that fits
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo


class UncalibratedPredictor:
    """Stands in when no fit was given: a policy that asks is refused with the way to give one."""

    decode_context_coef_s = 0.0

    def _refuse(self, *args, **kwargs):
        raise ConfigError("tierserve.exec_model_file", None,
                          "a fit of this engine's iterations: run with iteration_log, then `tierserve calibrate "
                          "--iterations LOG --out fit.json`, and set exec_model_file (this policy asks the "
                          "execution-time predictor)")

    iteration_time = decode_base_time = max_prefill_tokens_within = _refuse


def make_predictor(exec_model_file: str | None):
    return LinearPredictor.from_file(exec_model_file) if exec_model_file else UncalibratedPredictor()
