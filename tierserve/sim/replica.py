# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""One LLM replica: paged KV blocks, continuous batching, preemption, and iteration timing.

The local policy plans each batch; the executor validates it, allocates blocks, and advances time.
Exact skip-ahead: when the policy marks a decode-only batch `repeatable`, the executor runs it as a
*decode run* of k iterations at once — bounded by the next completion, the first KV-block shortfall and
the policy's `max_repeat` — computing each iteration's time with the same arithmetic a single step uses,
and applying per-request progress once. An arrival (or anything that needs the replica's exact state)
truncates the run to the iteration in flight, so skipping and stepping give identical results.

The executor lives in rooms, one job each (docs/architecture.md; each module's docstring says what it owns):
  replica_state.py       the state, queues and load counters       decode_runs.py   decode runs, checkpoints
  chunk_runs.py          chunk runs                                iteration.py     planned iterations
  steady.py              runs and admissions started without a plan (the policy's promises)
  preemption.py          evictions, swap, relegation               migration_endpoints.py  live migration
  step_time.py           step-time variability                     runs.py          records of runs in flight
This module is the entry points: what the cluster and the readers call (`enqueue`, `poke`, `sync`,
`set_slowdown`), and the names other modules import from here.
"""
from __future__ import annotations

from tierserve.core import RequestState, Status
from tierserve.policies.local.base import LocalPolicy
from tierserve.sim.migration_endpoints import MigrationEndpoints
from tierserve.sim.replica_state import (_MAX_CHUNK_RUN, _MAX_REPEAT, _REVISE_AT_S, RANK_ITERATION_END, RANK_PLAN,
                                         prefill_attention_pairs)
from tierserve.sim.runs import BlockGrowth, ChunkRun, DecodeRun
from tierserve.sim.step_time import step_factor_key, step_time_factor


class Replica(MigrationEndpoints):
    """Executor of one replica; its local policy reads it through `self.view` (a read-only `ReplicaView`)."""

    def enqueue(self, state: RequestState, front: bool = False) -> None:
        """A request joins this replica's waiting queue (dispatch or migration of a queued request)."""
        if (self._chunks is not None and not self._queue_listeners
                and getattr(self.policy.on_arrival, "__func__", None) is LocalPolicy.on_arrival):
            # No hook or listener reads the state: the chunk run goes on (stepping, too, continues a chunk that
            # takes the whole budget whatever waits) less a last, partial chunk, which the policy would now plan.
            state.replica = self.index
            if state.status != Status.SWAPPED:
                state.status = Status.WAITING
            self._join_waiting(state, front)
            self._chunks_drop_partial()
            return
        self._flush()                   # the policy's hook sees the state as of now
        state.replica = self.index
        if state.status != Status.SWAPPED:
            state.status = Status.WAITING
        self._join_waiting(state, front)
        self.policy.on_arrival(state, self.view)
        for listener in self._queue_listeners:
            listener.queued(state)
        self.poke()

    def poke(self) -> None:
        """Something changed that the policy must see: re-plan at the end of this instant if idle (so
        requests arriving together share the first iteration), else after the iteration in flight."""
        if not self._busy:
            if not self._plan_pending:
                self._plan_pending = True
                self.loop.at(self.loop.now, RANK_PLAN, self._plan_if_idle)
        elif self._run is not None:
            self._truncate_run(self.loop.now, defer=True)
        elif self._chunks is not None:
            self._chunks_dissolve()

    def _plan_if_idle(self) -> None:
        self._plan_pending = False
        if not self._busy:
            self._start_next()

    def set_slowdown(self, factor: float) -> None:
        """Scale iteration times from the next iteration on (a live migration copying KV out of here)."""
        if factor != self.slowdown:
            if self._run is not None:
                self._truncate_run(self.loop.now)
            elif self._chunks is not None:
                self._chunks_dissolve()
            self.slowdown = factor
            self._scaled = factor != 1.0 or self._varies


    def sync(self) -> None:
        """Bring per-request state up to now (iterations ended so far; blocks of the one in flight)."""
        run = self._run
        if run is not None:
            j = self._ended_by(run, self.loop.now)
            self._apply_run(run, j, j < len(run.ends))
        elif self._chunks is not None:
            self._chunks_dissolve()


    def _flush(self) -> None:
        """Apply the checkpoints a deferred cut left (the state as of that cut), before anything reads it."""
        run = self._run
        if run is not None and run.pending:
            self._apply_run(run, 0, False)
        elif self._chunks is not None:
            self._chunks_dissolve()



__all__ = ["BlockGrowth", "ChunkRun", "DecodeRun", "RANK_ITERATION_END", "RANK_PLAN", "Replica", "_MAX_CHUNK_RUN",
           "_MAX_REPEAT", "_REVISE_AT_S", "prefill_attention_pairs", "step_factor_key", "step_time_factor"]
