"""Sarathi-FCFS with a fixed chunk: Sarathi-Serve's batch (decodes, then partial prefills, then new prefills,
all within one token budget) whose budget is a fixed chunk size — the shared-cluster baseline of Niyama
(seed 003: chunk 256, set by the strictest class's TBT) and, with a chunk per replica, each pool of a siloed
deployment (256 for the strict pool, 2K for relaxed ones; `chunk_by_replica`, filled in by the experiment
that also routes classes to pools with the `silo` cluster policy).

`sarathi_edf` and `sarathi_srpf` keep this batch shape and order prefills by deadline / remaining prefill.
"""
from __future__ import annotations

from collections.abc import Sequence

from tierserve.core import BatchPlan, ConfigError, RequestState
from tierserve.policies.local.base import ReplicaView
from tierserve.policies.local.sarathi import SarathiPolicy


def check_chunk(name: str, value) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ConfigError(name, value, "an integer number of tokens >= 1")
    return value


class ChunkedView:
    """A replica view whose token budget is capped at a chunk (everything else read through)."""

    __slots__ = ("_view", "token_budget")

    def __init__(self, view: ReplicaView, chunk: int) -> None:
        self._view = view
        self.token_budget = min(view.token_budget, chunk)

    def __getattr__(self, name: str):
        return getattr(self._view, name)


class SarathiFCFSPolicy(SarathiPolicy):
    """Sarathi-Serve with a fixed chunk of `chunk_tokens` per iteration (decode tokens included, as
    Sarathi's token budget counts them); `chunk_by_replica[i]` overrides it on replica i (silos)."""

    name = "sarathi_fcfs"
    default_token_budget = 2048     # the ceiling; the chunk below is what a batch may use

    def __init__(self, chunk_tokens: int = 256, chunk_by_replica: Sequence[int] | None = None) -> None:
        self.chunk_tokens = check_chunk("chunk_tokens", chunk_tokens)
        if chunk_by_replica is not None:
            if isinstance(chunk_by_replica, (str, bytes)) or not isinstance(chunk_by_replica, Sequence):
                raise ConfigError("chunk_by_replica", chunk_by_replica, "a list of chunk sizes, one per replica")
            for i, c in enumerate(chunk_by_replica):
                check_chunk(f"chunk_by_replica[{i}]", c)
            chunk_by_replica = tuple(chunk_by_replica)
        self.chunk_by_replica = chunk_by_replica

    def chunk_for(self, replica_index: int) -> int:
        per = self.chunk_by_replica
        if per is None:
            return self.chunk_tokens
        if replica_index >= len(per):
            raise ConfigError("chunk_by_replica", list(per), f"at least {replica_index + 1} entries (one per replica)")
        return per[replica_index]

    def plan(self, view: ReplicaView) -> BatchPlan:
        return super().plan(ChunkedView(view, self.chunk_for(view.index)))   # type: ignore[arg-type]

    def prefill_order(self, partial: list[RequestState]) -> list[RequestState]:
        return partial        # arrival order (running is sorted by arrival)
