# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""Chunk runs: the iterations of the same decodes beside one prefill's next chunks, timed ahead as one.

Owns: starting a chunk run after the iteration `_continue_chunk` started (`_chunks_start`), its per-iteration
events (`_chunks_tick`: the event order stays stepping's), dropping a last partial chunk when a request
arrives, and applying its iterations in one pass when it ends or is read (`_chunks_catch_up`,
`_chunks_dissolve`). May not touch: what plans or follows the run (iteration.py), decode runs.
"""
from __future__ import annotations

from math import log

from tierserve.core import RequestState
from tierserve.sim.decode_runs import DecodeRuns
from tierserve.sim.replica_state import _MAX_CHUNK_RUN, RANK_ITERATION_END
from tierserve.sim.runs import ChunkRun, NextSums, TokenGaps, advance_decode, emit_token


class ChunkRuns(DecodeRuns):
    """The replica's chunk runs (module docstring)."""

    def _chunks_start(self, batch: list[tuple[RequestState, int]], pc: int, num_decodes: int, ctx0: int,
                      free: int, rem_min: int, start_s: float, dt0: float, end0: float) -> bool:
        """Iteration 0 of `batch` (decodes, then a prefill chunk) has just started with `free` blocks left:
        time the iterations `_continue_chunk` would start after it, with the same arithmetic, while it surely
        would — up to the prompt's last chunk, the first decode's last token (`rem_min` tokens left each at
        least), a partial chunk while something waits, and as long as the decodes' growth (≤ one block per
        `block_size` iterations each) and the prefill's blocks surely fit in `free`; past that, stepping
        checks exactly. `pc`: the prefill's computed tokens after iteration 0. True: a run of ≥ 2 started."""
        if self._hold_whole_prompt:
            per_chunk = False
        elif self._hold_per_chunk:
            per_chunk = True
        else:
            return False
        p = batch[-1][0]
        budget = self.token_budget - num_decodes
        total = p.num_tokens
        generated = p.num_generated
        waiting = bool(self.waiting)
        bs = self.block_size
        p_blocks = p.num_blocks
        predictor = self.predictor
        scaled = self._scaled
        first = self.iterations - 1     # iteration 0's index: `_account` has counted it already
        ends, durations, chunks, p_needs = [end0], [dt0], [batch[-1][1]], [0]
        t = end0
        grown = 0                       # blocks the prefill takes after iteration 0
        limit = rem_min if rem_min < _MAX_CHUNK_RUN else _MAX_CHUNK_RUN
        j = 1
        while j < limit:                # iteration j: every decode is still short of its last token
            left = total - pc
            if left < 1 or (left == 1 and generated > 0):
                break                   # the prompt is done: it decodes next
            n = budget
            if left < n:
                if waiting:
                    break               # budget left over for a waiting request: the policy plans
                n = left
            if n < 1:
                break
            tokens = pc + n
            if not per_chunk and tokens < total:
                tokens = total
            need = -(-tokens // bs) - p_blocks
            if need < 0:
                need = 0
            if num_decodes * (-(-j // bs)) + grown + need > free:
                break                   # might not fit: stepping checks it exactly
            grown += need
            p_blocks += need
            pairs = 0.0
            pairs += n * (pc + n * 0.5)
            dt = predictor.iteration_time(n, pairs, num_decodes, ctx0 + num_decodes * j)
            if scaled:
                dt = self._scale(dt, first + j)
            dt += 0.0
            t = t + dt
            ends.append(t)
            durations.append(dt)
            chunks.append(n)
            p_needs.append(need)
            pc += n
            j += 1
        if j < 2:
            return False
        self._chunks = ChunkRun(batch, start_s, ends, durations, chunks, p_needs)
        self._held_carry = None         # as iteration 0's end leaves it (`_end_iteration` drops it)
        self.loop.at(end0, RANK_ITERATION_END, self._chunks_tick, self._version)
        return True

    def _chunks_tick(self, version: int) -> None:
        """The end of a chunk run's iteration (`run.ended` of them before it)."""
        if version != self._version:
            return
        run = self._chunks
        if run is None:                 # dissolved while this iteration ran: it ends as an ordinary one
            self._end_iteration(version)
            return
        j = run.ended + 1
        ends = run.ends
        if j == len(ends):
            self._chunks_catch_up(run, j, True)     # every iteration, the last as `_end_iteration` ends it
            return
        run.ended = j
        self.loop.at(ends[j], RANK_ITERATION_END, self._chunks_tick, version)

    def _chunks_dissolve(self) -> None:
        """Something reads or changes the state: bring it to what stepping has now (the iteration in flight
        allocated); the pending tick then ends that iteration as an ordinary one."""
        run = self._chunks
        assert run is not None          # only called while a chunk run is in flight
        self._chunks_catch_up(run, run.ended, False)

    def _chunks_drop_partial(self) -> None:
        """A request now waits: a last chunk short of the budget would be planned, not repeated; drop it
        unless it has started."""
        run = self._chunks
        assert run is not None
        chunks = run.chunks
        if chunks[-1] >= self.token_budget - (len(run.batch) - 1):
            return                      # every chunk takes the whole budget: stepping repeats them all
        ends = run.ends
        if run.ended == len(ends) - 1:
            return                      # the last iteration has started
        for seq in (ends, run.durations, chunks, run.p_needs):
            seq.pop()
        if len(ends) == 1:
            self._chunks = None         # iteration 0 alone, in flight: an ordinary iteration (state current)

    def _chunks_catch_up(self, run: ChunkRun, u: int, final: bool) -> None:
        """Apply iterations 0 … u-1 of the run to every request, all as `_end_iteration` and `_continue_chunk`
        would one by one (the same float operations in the same order). Not `final`: then start iteration u
        (its blocks, the statistics of iterations 1 … u) and make it the ordinary one in flight. `final`
        (u = every iteration, ended now): the last one ends as `_end_iteration` ends it, what follows too."""
        self._chunks = None
        if u == 0:
            return                      # iteration 0 is `_batch` already, allocated and charged
        batch = run.batch
        p = batch[-1][0]
        ends = run.ends
        spans = [ends[0] - run.start_s]     # each iteration's `now - _batch_start_s`
        shared_max = 0.0
        prev = ends[0]
        for j in range(1, u):
            e = ends[j]
            g = e - prev                # every decode's gap at iteration j (its last token came at ends[j-1])
            prev = e
            spans.append(g)
            if g > shared_max:
                shared_max = g
        first_end = ends[0]
        last = ends[u - 1]              # the decodes' last token
        alloc_to = u - 1 if final else u                    # iterations 1 … alloc_to start here
        scheduled_s = ends[alloc_to - 1]                    # the start of the last iteration started
        hists = self.tbt
        h0 = hists[0]
        log_min, inv, min_value = h0._log_min, h0._inv_log_step, h0.min_value
        # Iteration 0's gaps, as `_end_iteration` adds them (`TokenGaps`).
        gaps = TokenGaps(hists)
        tier_decodes = [0] * len(hists)
        bs = self.block_size
        grow = [0] * (alloc_to + 1)     # blocks the decodes take as iteration a (1 … alloc_to) starts
        finished: list[RequestState] = []
        nxt = NextSums()                # as `_end_iteration` gathers them
        p_index = len(batch) - 1
        for i in range(p_index):
            r = batch[i][0]
            c0 = advance_decode(r, u, spans, scheduled_s)
            c = c0 + u
            generated = r.num_generated
            gaps.run(r, first_end, shared_max, last)
            tier_decodes[r.tier] += 1
            # Iteration a needs ceil((c0 + a + 1) / bs) blocks: one more than `blocks` from a = blocks·bs − c0.
            blocks = r.num_blocks
            a = blocks * bs - c0
            if a <= alloc_to:
                while a <= alloc_to:
                    grow[a] += 1
                    blocks += 1
                    a += bs
                r.num_blocks = blocks
            if final:
                rem = r._request.output_tokens - generated
                if rem <= 0:
                    finished.append(r)  # type: ignore[union-attr]  # collect: finished is a list
                else:
                    nxt.add(r, c, blocks, bs, rem)
        gaps.close()
        # Iterations 1 … u-1: one gap for every decode, added once per decode of each tier, in order.
        for j in range(1, u):
            g = spans[j]
            b = int((log(g) - log_min) * inv) if g > min_value else 0
            for t, c in enumerate(tier_decodes):
                if c:
                    h = hists[t]
                    h.counts[b] = h.counts.get(b, 0) + c
                    h.total += c
                    total = h.sum
                    for _ in range(c):
                        total += g
                    h.sum = total
        # The prefill's chunks: only the run's last can be the prompt's last (it then emits, after the decodes).
        chunks = run.chunks
        pc = p.num_computed_tokens
        prompt = p.prompt_tokens
        service = p.service_s
        tokens = 0
        for j in range(u):
            n = chunks[j]
            c = pc + n
            service += spans[j]
            if pc < prompt:
                attained_prompt = p.attained_tokens - p.num_generated
                if c > attained_prompt:
                    p.attained_tokens += (c if c < prompt else prompt) - attained_prompt
            pc = c
            tokens += n
        p.num_computed_tokens = pc
        p.service_tokens += tokens
        p.service_s = service
        p.last_scheduled_s = scheduled_s
        # Iterations 1 … alloc_to start: blocks, then the statistics `_account` keeps, in iteration order.
        p_needs, durations = run.p_needs, run.durations
        free = self.free_blocks
        total_blocks = self.total_blocks
        max_used = self.max_used_blocks
        busy, kv = self.busy_s, self.kv_block_seconds
        p_blocks = p.num_blocks
        for a in range(1, alloc_to + 1):
            free -= grow[a] + p_needs[a]
            p_blocks += p_needs[a]
            used = total_blocks - free
            if used > max_used:
                max_used = used
            dt = durations[a]
            busy += dt
            kv += used * dt
        if free < 0:
            raise AssertionError(f"replica {self.index}: KV over capacity during a chunk run")
        p.num_blocks = p_blocks
        self.free_blocks = free
        self.max_used_blocks = max_used
        self.busy_s, self.kv_block_seconds = busy, kv
        self.iterations += alloc_to
        if not final:
            if pc >= p.num_tokens:
                raise AssertionError(f"replica {self.index}: a chunk run passed request {p.id}'s last chunk")
            batch[-1] = (p, chunks[u])
            self._batch = batch
            self._batch_start_s = last
            return
        batch[-1] = (p, chunks[u - 1])
        prefilling = pc != p.num_tokens
        if not prefilling:              # the prompt's last chunk: its token, as `_end_iteration` emits it
            single = TokenGaps(hists)
            rem = emit_token(p, pc, last, single)
            single.close()
            if rem <= 0:
                finished.append(p)
            else:
                nxt.add(p, pc, p_blocks, bs, rem)
        self._batch = []
        self._after_iteration(last, batch, finished, prefilling, nxt.count, nxt.grow, nxt.ctx, nxt.rem_min)

