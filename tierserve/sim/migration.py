"""Live migration of requests between replicas, as Llumnix does it (OSDI'24 §4.2; HEAD migration_coordinator).

A queued request (no KV) moves at once: withdrawn from the source queue, enqueued at the destination.
A running request migrates in stages. Each pre-copy stage reserves the destination blocks for the KV the
request holds now (beyond what earlier stages copied) and copies them while it keeps decoding on the source;
once the increment is ≤ `last_stage_max_blocks` (16) the final stage pauses it on the source (its downtime),
copies the rest, then commits: the source frees its blocks and the destination adopts it. After
`max_stages` (3) pre-copy stages without converging, or if the request finishes, is preempted, or the
destination cannot reserve blocks, the migration aborts: reservations are returned and a paused request
resumes on the source with its KV intact, so nothing is lost. One migration per instance at a time.
Stage time = handshake + `kv_transfer_time_s(blocks·block_size tokens)` (latency + bytes / link bandwidth).
While a live migration copies KV out of a replica, that replica's iterations run `source_slowdown` times
slower. Queued moves and live migrations are counted apart.

Defaults follow Llumnix (OSDI'24) as measured, not an ideal link: 1 GB/s is the migration bandwidth of
Llumnix's own simulator (`LatencyMemData`, shared/reference/llumnix-sarathi-vllm-schedulers.md §1.9); a last
stage of ≤ 4 blocks is the paper-era setting (v0.1.0), which with LLaMA-7B's 8 MB blocks gives the
constant tens-of-ms downtime the paper reports (5 blocks × 8 MB / 1 GB/s ≈ 42 ms); each stage pays two RPCs
(pre-allocate, then commit/next), ~1 ms each (our assumption); the paper reports ~1% slowdown of the other
requests on the source during a copy.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from tierserve.core import ConfigError, RequestState, Status
from tierserve.hardware.memory import kv_bytes_per_token, kv_transfer_time_s
from tierserve.policies.cluster.base import Move
from tierserve.sim.events import EventLoop
from tierserve.sim.replica import Replica

RANK_MIGRATION = 3   # after iteration ends, arrivals and policy ticks at the same instant


@dataclass(frozen=True, slots=True)
class MigrationParams:
    """Migration costs and limits (`ClusterConfig.migration_params`)."""

    bandwidth_gbytes_s: float = 1.0      # GB/s between two replicas (Llumnix simulator's migration_bandwidth)
    latency_s: float = 50e-6             # per-transfer link latency
    handshake_s: float = 2e-3            # per stage: two RPC round trips (pre-allocate; commit or next stage)
    max_stages: int = 3                  # Llumnix migration_max_stages
    last_stage_max_blocks: int = 4       # Llumnix v0.1.0 migration_last_stage_max_blocks (HEAD: 16)
    source_slowdown: float = 1.01        # iteration-time factor on the source while it copies (paper: ~1%)

    @classmethod
    def from_dict(cls, d: dict) -> MigrationParams:
        names = {f.name for f in fields(cls)}
        for k in d:
            if k not in names:
                raise ConfigError(f"migration_params.{k}", d[k], f"one of {', '.join(sorted(names))}")
        p = cls(**d)
        for name in ("bandwidth_gbytes_s",):
            if not getattr(p, name) > 0:
                raise ConfigError(f"migration_params.{name}", getattr(p, name), "a positive number")
        if not p.source_slowdown >= 1.0:
            raise ConfigError("migration_params.source_slowdown", p.source_slowdown, "a factor >= 1.0")
        for name in ("latency_s", "handshake_s"):
            if not getattr(p, name) >= 0:
                raise ConfigError(f"migration_params.{name}", getattr(p, name), "a number >= 0")
        if not (isinstance(p.max_stages, int) and p.max_stages >= 1):
            raise ConfigError("migration_params.max_stages", p.max_stages, "an integer >= 1")
        if not (isinstance(p.last_stage_max_blocks, int) and p.last_stage_max_blocks >= 0):
            raise ConfigError("migration_params.last_stage_max_blocks", p.last_stage_max_blocks, "an integer >= 0")
        return p


class LiveMigration:
    """One request's migration in progress."""

    __slots__ = ("state", "src", "dst", "reserved", "stages", "preemptions0", "paused_s")

    def __init__(self, state: RequestState, src: Replica, dst: Replica) -> None:
        self.state = state
        self.src = src
        self.dst = dst
        self.reserved = 0          # destination blocks reserved = KV blocks copied so far
        self.stages = 0            # pre-copy stages done
        self.preemptions0 = state.num_preemptions
        self.paused_s = -1.0


class MigrationExecutor:
    """Starts the Moves a migrating cluster policy returns and runs them on the event loop."""

    def __init__(self, replicas: list[Replica], loop: EventLoop, cfg) -> None:
        self.replicas = replicas
        self.loop = loop
        self.params = MigrationParams.from_dict(dict(cfg.migration_params))
        self.model = cfg.replica.model
        self.tp = cfg.replica.tp
        self.block_size = cfg.replica.block_size
        self.block_bytes = kv_bytes_per_token(self.model, 1) * self.block_size
        self.handles = None
        self.active: list[LiveMigration] = []
        self.started = self.committed = self.aborted = self.refused = self.queued_moves = 0   # live: started…aborted
        self.blocks_moved = 0
        self.downtimes: list[float] = []
        self.abort_reasons: dict[str, int] = {}

    def bind(self, cluster) -> None:
        self.handles = cluster.handles

    # ----- costs -----
    def copy_time_s(self, blocks: int) -> float:
        p = self.params
        return p.handshake_s + kv_transfer_time_s(blocks * self.block_size, self.model, self.tp,
                                                  p.bandwidth_gbytes_s, p.latency_s)

    @staticmethod
    def _reserve(dst: Replica, blocks: int) -> bool:
        """Reserve on the destination (the replica first cuts a decode run sized on its free blocks)."""
        return dst.reserve_blocks(blocks)

    def _busy(self, index: int) -> bool:
        return self.handles is not None and self.handles[index].migrating_count > 0

    def _hold(self, m: LiveMigration, delta: int) -> None:
        if self.handles is not None:
            self.handles[m.src.index].migrating_count += delta
            self.handles[m.dst.index].migrating_count += delta

    # ----- entry -----
    def start(self, move: Move) -> bool:
        """Begin `move`; False (counted as refused) if it is not possible now."""
        state = move.request
        if move.source == move.destination or self._busy(move.source) or self._busy(move.destination):
            self.refused += 1
            return False
        src, dst = self.replicas[move.source], self.replicas[move.destination]
        src.sync()
        if state.replica != src.index:
            self.refused += 1
            return False
        if state.status == Status.WAITING and state.num_blocks == 0:
            src.withdraw_waiting(state)          # no KV: Llumnix's waiting-request migration
            dst.enqueue(state)
            state.num_migrations += 1
            self.queued_moves += 1
            src.poke()
            return True
        if state.status != Status.RUNNING or len(dst.running) + len(dst.paused) >= dst.max_num_seqs:
            self.refused += 1           # (a full batch on the destination cannot take one more request)
            return False
        m = LiveMigration(state, src, dst)
        self.started += 1
        self.active.append(m)
        self._hold(m, +1)
        src.set_slowdown(self.params.source_slowdown)
        self._stage(m)
        return True

    # ----- stages -----
    def _stage(self, m: LiveMigration) -> None:
        m.src.sync()
        s = m.state
        if s.status != Status.RUNNING or s.replica != m.src.index or s.num_preemptions != m.preemptions0:
            self._abort(m, "finished" if s.status == Status.FINISHED else "preempted")
            return
        increment = s.num_blocks - m.reserved
        if increment <= self.params.last_stage_max_blocks:
            m.src.pause(s, lambda ok: self._paused(m, ok))
            return
        if m.stages >= self.params.max_stages:
            self._abort(m, "did_not_converge")
            return
        if not self._reserve(m.dst, increment):
            self._abort(m, "destination_full")
            return
        m.reserved += increment
        m.stages += 1
        self.blocks_moved += increment
        self.loop.at(self.loop.now + self.copy_time_s(increment), RANK_MIGRATION, self._stage, m)

    def _paused(self, m: LiveMigration, ok: bool) -> None:
        if not ok:
            s = m.state
            self._abort(m, "finished" if s.status == Status.FINISHED else "preempted")
            return
        now = self.loop.now
        m.paused_s = now
        rest = m.state.num_blocks - m.reserved
        if rest > 0 and not self._reserve(m.dst, rest):
            m.src.resume_paused(m.state)
            self._abort(m, "destination_full")
            return
        m.reserved += rest
        # The last, partly written block was excluded from pre-copy stages: it is copied again here.
        copy = min(rest + 1, m.state.num_blocks)
        self.blocks_moved += copy
        self.loop.at(now + self.copy_time_s(copy), RANK_MIGRATION, self._commit, m)

    def _commit(self, m: LiveMigration) -> None:
        m.src.release_paused(m.state)
        m.dst.adopt(m.state, m.reserved)
        self.downtimes.append(self.loop.now - m.paused_s)
        self.committed += 1
        self._end(m)

    def _abort(self, m: LiveMigration, reason: str) -> None:
        if m.reserved:
            m.dst.unreserve_blocks(m.reserved)
            m.reserved = 0
        self.aborted += 1
        self.abort_reasons[reason] = self.abort_reasons.get(reason, 0) + 1
        self._end(m)

    def _end(self, m: LiveMigration) -> None:
        self.active.remove(m)
        self._hold(m, -1)
        m.src.set_slowdown(1.0)

    # ----- results -----
    def stats(self) -> dict[str, float]:
        d = np.asarray(self.downtimes, dtype=float)
        out: dict[str, float] = {
            "migrations_live_started": self.started,
            "migrations_live_committed": self.committed,
            "migrations_live_aborted": self.aborted,
            "migrations_queued": self.queued_moves,
            "migrations_refused": self.refused,
            "migration_bytes": float(self.blocks_moved * self.block_bytes),
            "migration_downtime_total_s": float(d.sum()) if d.size else 0.0,
            "migration_downtime_mean_s": float(d.mean()) if d.size else 0.0,
            "migration_downtime_p99_s": float(np.percentile(d, 99)) if d.size else 0.0,
        }
        for reason, n in sorted(self.abort_reasons.items()):
            out[f"migrations_live_aborted_{reason}"] = n
        return out
