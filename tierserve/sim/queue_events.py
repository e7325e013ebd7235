# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""The queue events a replica reports to the indexes the simulator keeps beside it (`QueueListener`).

An index such as `DeadlineLoad` (deadline_load.py) must see every request that joins or leaves a replica's
queues, and it must not do so by wrapping the local policy's hooks (the policy's hooks are the policy's;
DESIGN.md puts the simulator's bookkeeping on the simulator's side). The replica calls each listener
registered with `Replica.add_queue_listener` right after the policy's own hook for the same event:

  queued     a request joined waiting or swapped: dispatched or moved here (`on_arrival`), or preempted
             (`on_preempt`); its deadline and tokens left are then fixed until it leaves the queue;
  relegated  a request was relegated (`on_relegate`);
  left       a request left this replica from a queue or a pause (`on_migrate_out`);
  finished   a request produced its last token here (`on_finish`).

A request that leaves a queue for running raises no event (the listener finds it in `running`, as the
policy does). Owns: this interface. May not touch: a replica (listeners read it; they never change it).
"""
from __future__ import annotations

from tierserve.core import RequestState


class QueueListener:
    """Hears a replica's queue events (module docstring); every method is a no-op here."""

    def queued(self, state: RequestState) -> None:
        pass

    def relegated(self, state: RequestState) -> None:
        pass

    def left(self, state: RequestState) -> None:
        pass

    def finished(self, state: RequestState) -> None:
        pass
