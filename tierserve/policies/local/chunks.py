"""How many tokens a request runs in one iteration: the chunk rule the budget-loop policies share (`vllm` and
its subclasses, the priority loop of `priority.py`, `sarathi`). One function; it reads the state, changes
nothing."""
from __future__ import annotations

from tierserve.core import RequestState


def next_chunk(r: RequestState, cap: int, budget: int) -> int:
    """The tokens `r` runs this iteration: what it has left to compute (a decode's 1, or the rest of its prompt),
    at most `cap` tokens (0: no cap; vLLM's `long_prefill_threshold`, the priority loop's `chunk`) and at most
    the `budget` the iteration has left."""
    n = r.num_tokens - r.num_computed_tokens
    if cap and n > cap:
        n = cap
    return n if n <= budget else budget
