"""Length mixes of seed 001 (UniBoost): reasoning + chat requests, and the two-class starvation workload.

`reasoning_chat_lengths(n, rng, reasoning_fraction=0.7)`: each request is a reasoning request with probability
`reasoning_fraction` — (prompt, output) from the DeepSeek-R1 fit (ServeGen's `deepseek_r1` PMF) — else an Azure
conversation request (the `azure2023_conv` fit). Both are fitted distributions shipped with tierserve, so no
shared data is needed. To fit the model's context, prompts are cut to `max_prompt` and outputs to
`max_total − prompt` (a generation stopped at the context limit, as the seed's "loopy behaviour up to system
constraints"); how many were cut is returned. Common random numbers: the class draw, the reasoning pool and
the chat pool come from fixed child streams, so changing `reasoning_fraction` keeps each pool's draws.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tierserve.workload.lengths import fitted_lengths


@dataclass(frozen=True, slots=True)
class MixedLengths:
    prompts: np.ndarray
    outputs: np.ndarray
    reasoning: np.ndarray          # True for a reasoning request
    num_prompt_cut: int
    num_output_cut: int


def reasoning_chat_lengths(n: int, rng: np.random.Generator, reasoning_fraction: float = 0.7,
                           max_total: int = 8192, max_prompt: int = 4096,
                           reasoning: str = "deepseek_r1", chat: str = "azure2023_conv") -> MixedLengths:
    if not 0.0 <= reasoning_fraction <= 1.0:
        raise ValueError(f"reasoning_fraction must lie in [0, 1]; got {reasoning_fraction}")
    r_cls, r_reason, r_chat = rng.spawn(3)
    is_reason = r_cls.random(n) < reasoning_fraction
    pr, orr = fitted_lengths(reasoning).sample(n, r_reason)
    pc, oc = fitted_lengths(chat).sample(n, r_chat)
    prompts = np.where(is_reason, pr, pc).astype(np.int64)
    outputs = np.where(is_reason, orr, oc).astype(np.int64)
    cut_p = prompts > max_prompt
    prompts = np.minimum(prompts, max_prompt)
    cut_o = prompts + outputs > max_total
    outputs = np.minimum(outputs, max_total - prompts)
    return MixedLengths(prompts, outputs, is_reason, int(cut_p.sum()), int(cut_o.sum()))


def short_long_lengths(n: int, rng: np.random.Generator, long_fraction: float = 0.1,
                       short: tuple[int, int] = (125, 100), long: tuple[int, int] = (2000, 6000)) -> MixedLengths:
    """Seed 001 A.3: 90% short (125 prompt / 100 output) + 10% long (2k / 6k)."""
    is_long = rng.random(n) < long_fraction
    prompts = np.where(is_long, long[0], short[0]).astype(np.int64)
    outputs = np.where(is_long, long[1], short[1]).astype(np.int64)
    return MixedLengths(prompts, outputs, is_long, 0, 0)
