# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""Migration endpoints: what the simulator's migration executor (sim/migration.py) calls on a replica.

Owns: pausing a running request once its iteration ends (its KV held), releasing or resuming it, reserving
blocks for an incoming copy and adopting the request, and withdrawing a queued request. May not touch: how
a migration is decided or timed (sim/migration.py, the cluster policy).
"""
from __future__ import annotations

from typing import Callable

from tierserve.core import RequestState, Status
from tierserve.sim.steady import SteadyPlans


class MigrationEndpoints(SteadyPlans):
    """The replica's migration endpoints (module docstring)."""

    def in_flight(self, state: RequestState) -> bool:
        """True if `state` is part of the iteration (or decode run) executing now."""
        if self._run is not None:
            return state in self._run.batch
        if self._chunks is not None:
            return any(r is state for r, _ in self._chunks.batch)
        return any(r is state for r, _ in self._batch)

    def pause(self, state: RequestState, on_paused: Callable[[bool], None]) -> None:
        """Stop scheduling a running request once the iteration in flight ends; its KV blocks stay held.

        `on_paused(True)` fires when it is paused; `on_paused(False)` if it finished, was preempted, or
        left this replica first (the migration then aborts and nothing is lost).
        """
        self._flush()
        if state.status != Status.RUNNING or state.replica != self.index:
            on_paused(False)
            return
        if not self.in_flight(state):
            self._pause_now(state)
            on_paused(True)
            self.poke()                 # the running set changed: the policy must see it, as stepping would
            return
        self._pause_requests.append((state, on_paused))
        if self._run is not None:
            self._truncate_run(self.loop.now)

    def _pause_now(self, state: RequestState) -> None:
        self._leave_running(state)
        state.status = Status.MIGRATING
        self.paused.append(state)

    def _settle_pauses(self) -> None:
        if not self._pause_requests:
            return
        pending, self._pause_requests = self._pause_requests, []
        for state, cb in pending:
            ok = state.status == Status.RUNNING and state.replica == self.index
            if ok:
                self._pause_now(state)
            cb(ok)

    def release_paused(self, state: RequestState) -> None:
        """Migration committed: the paused request leaves; its blocks here are freed."""
        self._flush()
        self.paused.remove(state)
        self.free_blocks += state.num_blocks
        state.num_blocks = 0
        self.policy.on_migrate_out(state, self.view)
        for listener in self._queue_listeners:
            listener.left(state)
        self.poke()

    def resume_paused(self, state: RequestState) -> None:
        """Migration aborted: the paused request runs here again, KV intact."""
        self._flush()
        self.paused.remove(state)
        state.status = Status.RUNNING
        self._join_running(state)
        self.poke()

    def reserve_blocks(self, n: int) -> bool:
        """Hold n free blocks for an incoming migration (Llumnix pre-allocates on the destination).

        A decode run in flight was sized on the current free blocks, so it is cut to the iteration in flight.
        """
        if self._run is not None:
            self._truncate_run(self.loop.now)
        elif self._chunks is not None:
            self._chunks_dissolve()
        if n > self.free_blocks - self.watermark_blocks:
            return False
        self.free_blocks -= n
        self.reserved_blocks += n
        return True

    def unreserve_blocks(self, n: int) -> None:
        self._flush()
        self.free_blocks += n
        self.reserved_blocks -= n
        self.poke()

    def adopt(self, state: RequestState, reserved: int) -> None:
        """Migration committed: take over a running request whose KV was copied into `reserved` blocks."""
        self._flush()
        self.reserved_blocks -= reserved
        state.num_blocks = reserved
        state.replica = self.index
        state.status = Status.RUNNING
        state.num_migrations += 1
        self._join_running(state)
        self.policy.on_migrate_in(state, self.view)
        self.poke()

    def withdraw_waiting(self, state: RequestState) -> None:
        """Take a queued request (no KV, or swapped) off this replica so it can be enqueued elsewhere."""
        self._flush()
        if state.status == Status.SWAPPED:
            self._leave_swapped(state)
            self._release_host_blocks(state)
        else:
            self._leave_waiting(state)
        state.replica = -1
        self.policy.on_migrate_out(state, self.view)
        for listener in self._queue_listeners:
            listener.left(state)
