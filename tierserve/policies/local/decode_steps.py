"""The decode pass `vllm_v0` and `sarathi` (and the Sarathi orders built on it) share: running requests, in
their service order, each get one decode step while its KV blocks fit. The fast form only: the caller runs it
when neither the batch cap nor the token budget can bind, and takes over at the first request whose blocks do
not fit (its own loop evicts there). It reads the requests and appends to the caller's lists; nothing else."""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from tierserve.core import RequestState


def decode_while_blocks_fit(running: Sequence[RequestState], scheduled: list, free: int, block_size: int,
                            hold: Optional[Callable[[RequestState, int, int], int]] = None,
                            partial: Optional[list[RequestState]] = None) -> tuple[int, int]:
    """Append `(r, 1)` to `scheduled` for each r of `running` in order, taking its block growth from `free`,
    until one does not fit. A decode holds ceil(max(computed + 1, known tokens) / block_size) blocks, or
    `hold(r, 1, block_size)` where the policy's allocation rule says otherwise. With `partial`, a request still
    in its prefill (more than one token left, or none generated) is set aside there instead of decoded.

    Returns (the index of the first request whose blocks do not fit, or len(running); the blocks left free)."""
    for j, r in enumerate(running):
        c = r.num_computed_tokens
        known = r.num_tokens
        if partial is not None and (known - c > 1 or r.num_generated == 0):
            partial.append(r)
            continue
        if hold is None:
            c += 1
            need = -(-(c if c > known else known) // block_size) - r.num_blocks
        else:
            need = hold(r, 1, block_size) - r.num_blocks
        if need > free:
            return j, free
        scheduled.append((r, 1))
        if need > 0:
            free -= need
    return len(running), free
