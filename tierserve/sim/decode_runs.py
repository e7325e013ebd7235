# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""Decode runs (skip-ahead): a repeatable decode-only batch executed as k iterations at once.

Owns: timing a run (`_launch_run`: the same arithmetic a single decode step uses, bounded by completions,
the first KV shortfall and the plan's `max_repeat` / `revise_at_s`), applying its iterations to every
request in one pass (`_apply_run`), checkpoints recorded by readers and deferred cuts and applied in the
next pass (`checkpoint`, `_apply_pieces`), the blocks a run adds read without a pass (`used_blocks_now`,
`BlockGrowth`), and cutting a run short (`_truncate_run`). May not touch: what starts a run or follows it
(steady.py), general iterations (iteration.py), or the policy (a run never asks it anything).
"""
from __future__ import annotations

from math import log

from tierserve.core import RequestState
from tierserve.policies.local.base import PolicyError
from tierserve.sim.replica_state import _REVISE_AT_S, RANK_ITERATION_END, ReplicaState
from tierserve.sim.runs import BlockGrowth, DecodeRun, NextSums, TokenGaps, advance_decode


class DecodeRuns(ReplicaState):
    """The replica's decode runs (module docstring)."""

    def checkpoint(self) -> None:
        """`sync` for a reader that adds a decode run's unapplied progress itself (`DeadlineLoad.load`): the
        run's iterations ended by now are recorded as a pending checkpoint — applied in the run's next pass with
        the arithmetic `sync` would apply them with now, as a deferred cut's are — instead of a pass now."""
        run = self._run
        if run is not None:
            j = self._ended_by(run, self.loop.now)
            if j > (run.pending[-1][0] if run.pending else run.done):
                run.pending.append((j, j < len(run.ends)))
        elif self._chunks is not None:
            self._chunks_dissolve()

    def used_blocks_now(self) -> int:
        """KV blocks in use as `sync` would leave them now, without its pass over a decode run: the run's
        iterations ended by now are recorded as a pending checkpoint (as `checkpoint` does; applied later with
        the same arithmetic) and the blocks they add are read off the run's `BlockGrowth`."""
        self.checkpoint()
        run = self._run
        if run is None or not run.pending:
            return self.total_blocks - self.free_blocks
        u, flying = run.pending[-1]
        growth = run.block_growth
        if growth is None:
            growth = run.block_growth = BlockGrowth(run.batch, run.done, self.block_size)
        added = growth.added(u + 1 if flying else u) - growth.added(run.applied_tokens)
        return self.total_blocks - self.free_blocks + added


    def _launch_run(self, batch: list[RequestState], ctx0: int, k: int, grow: list, tiers: dict[int, int],
                    revise: float, now: float) -> bool:
        """Start the decode run of `batch` (running decodes, checked): `ctx0` = Σ (computed + 1), `k` the
        iterations allowed by completions and the plan, `grow` (request, blocks) for its first iteration."""
        b = len(batch)
        bs = self.block_size
        inline_hold = self._decode_hold_inline
        # Blocks for the first iteration, as `_allocate` would give them (its checks hold for running decodes).
        if grow:
            free = self.free_blocks
            for r, need in grow:
                if need > free:
                    raise PolicyError(f"{self.policy.name}: request {r.id} needs {need} KV blocks, {free} free")
                free -= need
                r.num_blocks += need
            self.free_blocks = free
        used = self.total_blocks - self.free_blocks
        if used > self.max_used_blocks:
            self.max_used_blocks = used
        if b > self.token_budget:
            raise PolicyError(f"{self.policy.name}: batch of {b} tokens > token budget {self.token_budget}")
        # After this iteration's blocks every request holds ≥ c + 1 tokens' worth, so each of the next k − 1
        # iterations adds at most ceil((k − 1) / bs) blocks per request: when even that fits, k stands.
        if k > 1 and (not inline_hold or b * (-(-(k - 1) // bs)) > self.free_blocks):
            k = self._kv_bound(batch, k, bs)
        base = self.predictor.decode_base_time(b)
        coef = self.predictor.decode_context_coef_s
        scaled = self._scaled
        ends = []
        t = now
        busy = 0.0
        if not scaled and revise == _REVISE_AT_S:      # the usual case: the loop below without its two tests
            for j in range(k):
                dt = base + coef * (ctx0 + b * j)
                t = t + dt
                busy += dt
                ends.append(t)
        else:
            first = self.iterations     # the index stepping gives iteration 0 of the run
            for j in range(k):
                dt = base + coef * (ctx0 + b * j)     # the same arithmetic as a single decode step
                if scaled:
                    dt = self._scale(dt, first + j)
                t = t + dt
                busy += dt
                ends.append(t)
                if t >= revise:      # the policy re-plans after the iteration that crosses its revision point
                    break
        self.iterations += len(ends)
        self.busy_s += busy
        self._run = DecodeRun(batch, now, ends, tiers)      # KV block-seconds are charged as it is applied
        self._version += 1
        self.loop.at(ends[-1], RANK_ITERATION_END, self._end_run, self._version)
        return True

    def _kv_bound(self, batch: list[RequestState], k: int, bs: int) -> int:
        """Largest k' ≤ k such that iterations 1..k'-1 find the KV blocks they need (iteration 0's are held)."""
        free = self.free_blocks

        def extra(kk: int) -> int:
            total = 0
            for r in batch:
                over = r.num_computed_tokens + kk - r.num_blocks * bs
                if over > 0:
                    total += -(-over // bs)
            return total

        if extra(k) <= free:
            return k
        lo, hi = 1, k          # extra(lo) == 0 ≤ free; extra(hi) > free
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if extra(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def _apply_run(self, run: DecodeRun, upto: int, in_flight: bool, finished: list | None = None) -> None:
        """Apply the run's pending checkpoints, then iterations … upto-1 (`in_flight`: the next one has
        started, so its blocks are held), to every request in the run, in one pass; with `finished`, append
        to it the requests whose last token that was (in batch order)."""
        pieces = run.pending
        if upto > (pieces[-1][0] if pieces else run.done):
            pieces.append((upto, in_flight))
        if not pieces:      # already applied (another replica read this one at the instant its run ended)
            if finished is not None:
                finished += [r for r in run.batch if r.num_generated >= r._request.output_tokens]
            return
        if len(pieces) > 1:
            self._apply_pieces(run, finished)
            return
        upto, in_flight = pieces.pop()
        ends = run.ends
        m0 = run.done
        used_before = self.total_blocks - self.free_blocks
        cnt = upto - m0
        last = ends[upto - 1]
        hists = self.tbt
        shared_max = self._add_shared_gaps(run, m0, upto)
        bs = self.block_size
        first_end = ends[m0]
        extra_tok = 1 if in_flight else 0
        free = self.free_blocks
        span = last - (ends[m0 - 1] if m0 else run.start_s)
        # As stepping would leave it: the start of the iteration in flight, else of the last one applied.
        scheduled_s = last if in_flight else (ends[upto - 2] if upto >= 2 else run.start_s)
        # Each request's first gap; requests that ran the previous iteration share it, so it is binned once
        # (`TokenGaps`: the same bins, counts and sums, added in the same order).
        gaps = TokenGaps(hists)
        collect = finished is not None
        # At a run's end, what the next run of the same batch (less the finished) needs, gathered here.
        carry = collect and self._keeps_batch
        nxt = NextSums()
        for r in run.batch:
            c = r.num_computed_tokens + cnt
            r.num_computed_tokens = c
            r.num_tokens += cnt
            generated = r.num_generated + cnt
            r.num_generated = generated
            r.attained_tokens += cnt
            r.service_tokens += cnt
            r.service_s += span
            r.last_scheduled_s = scheduled_s
            gaps.run(r, first_end, shared_max, last)
            need = -(-(c + extra_tok) // bs) - r.num_blocks
            if need > 0:
                r.num_blocks += need
                free -= need
            if collect:
                rem = r._request.output_tokens - generated
                if rem <= 0:
                    finished.append(r)  # type: ignore[union-attr]  # collect: finished is a list
                elif carry:
                    nxt.add(r, c, r.num_blocks, bs, rem)
        if carry:
            self._carry = (nxt.count, nxt.grow, nxt.ctx, nxt.rem_min)
        gaps.close()
        if free < 0:
            raise AssertionError(f"replica {self.index}: KV over capacity during a decode run")
        self.free_blocks = free
        used = self.total_blocks - free
        if used > self.max_used_blocks:
            self.max_used_blocks = used
        # Trapezoid over the applied iterations; exact for one iteration, as stepping charges it.
        self.kv_block_seconds += 0.5 * (used_before + used) * span
        run.done = upto
        run.applied_tokens = upto + extra_tok

    def _add_shared_gaps(self, run: DecodeRun, m0: int, upto: int) -> float:
        """Add the token gaps every request of the run shares (iterations m0+1 … upto-1 after their
        predecessors) to each tier's histogram; returns the largest (0 if none)."""
        shared_max = 0.0
        if upto - m0 > 1:
            segments: list[tuple[int, int, float]] = []
            shared_max = self._shared_segments(run, m0, upto, segments)
            for tier, c in run.tier_counts.items():
                h = self.tbt[tier]
                counts = h.counts
                for b, n, sm in segments:       # LogHistogram.add_bin(b, n * c, sm * c), inlined
                    counts[b] = counts.get(b, 0) + n * c
                    h.total += n * c
                    h.sum += sm * c
        return shared_max

    def _shared_segments(self, run: DecodeRun, m0: int, upto: int, segments: list[tuple[int, int, float]]) -> float:
        """Append to `segments` the shared gaps of iterations m0+1 … upto-1 (upto − m0 > 1) binned once each,
        as (bin, gaps, their sum) per run of equal bins (the bins `add` would give, one by one); returns the
        largest gap."""
        ends = run.ends
        h0 = self.tbt[0]
        log_min, inv, min_value = h0._log_min, h0._inv_log_step, h0.min_value
        shared_max = 0.0
        cur_b, n_b, sum_b = -1, 0, 0.0
        prev = ends[m0]
        for m in range(m0 + 1, upto):
            e = ends[m]
            gap = e - prev
            prev = e
            if gap > shared_max:
                shared_max = gap
            b = int((log(gap) - log_min) * inv) if gap > min_value else 0
            if b == cur_b:
                n_b += 1
                sum_b += gap
            else:
                if n_b:
                    segments.append((cur_b, n_b, sum_b))
                cur_b, n_b, sum_b = b, 1, gap
        segments.append((cur_b, n_b, sum_b))
        return shared_max

    def _apply_pieces(self, run: DecodeRun, finished: list | None) -> None:
        """`_apply_run` of each pending checkpoint in turn, fused into one pass over the batch: every
        quantity is computed with the same operations in the same order as applying them one by one (integer
        counts in any order)."""
        pieces = run.pending
        ends = run.ends
        m0 = run.done
        hists = self.tbt
        spans: list[float] = []
        later_gaps: list[float] = []
        shared_max = self._add_shared_gaps(run, m0, pieces[0][0])    # the first piece's, before its requests'
        prev = m0
        for u, flying in pieces:
            if prev > m0:
                # A later piece's first gap is the same for every request (all emitted at ends[prev-1]).
                g = ends[prev] - ends[prev - 1]
                later_gaps.append(g)
                if g > shared_max:
                    shared_max = g
            spans.append(ends[u - 1] - (ends[prev - 1] if prev else run.start_s))
            prev = u
        upto, in_flight = pieces[-1]
        cnt = upto - m0
        last = ends[upto - 1]
        scheduled_s = last if in_flight else (ends[upto - 2] if upto >= 2 else run.start_s)
        # The shared gaps of later pieces do not depend on the request: their largest, for tbt_max.
        for p in range(1, len(pieces)):
            a, b = pieces[p - 1][0], pieces[p][0]
            for m in range(a + 1, b):
                g = ends[m] - ends[m - 1]
                if g > shared_max:
                    shared_max = g
        bs = self.block_size
        extra_tok = 1 if in_flight else 0
        # Tokens of the run each checkpoint covers (from the last one applied), and the blocks each adds.
        covered: list[int] = [u - m0 + (1 if flying else 0) for u, flying in pieces]
        covered_last = cnt + extra_tok
        grow = [0] * len(pieces)
        first_end = ends[m0]
        # Counts of the current bin per tier, and each tier's running sum (added in the same order as
        # LogHistogram.add would), written back once per bin change and at the end.
        gaps = TokenGaps(hists)
        collect = finished is not None
        carry = collect and self._keeps_batch     # as in `_apply_run`
        nxt = NextSums()
        for r in run.batch:
            c0 = advance_decode(r, cnt, spans, scheduled_s)
            generated = r.num_generated
            gaps.run(r, first_end, shared_max, last)
            blocks = r.num_blocks
            next_block = blocks * bs - c0 + 1     # tokens covered at which r needs its next block
            if next_block <= covered_last:
                p = 0
                while next_block <= covered_last:     # each block to the checkpoint that first covers it
                    while covered[p] < next_block:
                        p += 1
                    grow[p] += 1
                    next_block += bs
                blocks = -(-(c0 + covered_last) // bs)
                r.num_blocks = blocks
            if collect:
                rem = r._request.output_tokens - generated
                if rem <= 0:
                    finished.append(r)  # type: ignore[union-attr]  # collect: finished is a list
                elif carry:
                    nxt.add(r, c0 + cnt, blocks, bs, rem)
        if carry:
            self._carry = (nxt.count, nxt.grow, nxt.ctx, nxt.rem_min)
        gaps.close()
        self._add_later_pieces(run, later_gaps)
        free = self.free_blocks
        used_before = self.total_blocks - free
        for p in range(len(pieces)):
            free -= grow[p]
            if free < 0:
                raise AssertionError(f"replica {self.index}: KV over capacity during a decode run")
            used = self.total_blocks - free
            if used > self.max_used_blocks:
                self.max_used_blocks = used
            self.kv_block_seconds += 0.5 * (used_before + used) * spans[p]
            used_before = used
        self.free_blocks = free
        run.done = upto
        run.applied_tokens = upto + extra_tok
        pieces.clear()

    def _add_later_pieces(self, run: DecodeRun, later_gaps: list[float]) -> None:
        """The histogram part of the pending checkpoints after the first, as applying them in turn adds it:
        per piece its shared gaps, then every request's first gap (`later_gaps`: one value for all). Each
        tier's sum takes the same additions in the same order; the bin counts (integers) are gathered in runs
        of equal bins and added once per run."""
        pieces = run.pending
        if len(pieces) < 2:
            return
        hists = self.tbt
        h0 = hists[0]
        log_min, inv, min_value = h0._log_min, h0._inv_log_step, h0.min_value
        tiers: list[int] = []
        weights: list[int] = []               # requests of the run per tier
        sums: list[float] = []
        for tier, c in run.tier_counts.items():
            tiers.append(tier)
            weights.append(c)
            sums.append(hists[tier].sum)
        num_tiers = len(tiers)
        run_bins: list[int] = []              # runs of equal bins over all later pieces: bin, gaps per request
        run_gaps: list[int] = []
        cur_bin, cur_gaps = -1, 0
        segments: list[tuple[int, int, float]] = []
        for p in range(1, len(pieces)):
            a, b = pieces[p - 1][0], pieces[p][0]
            if b - a > 1:
                segments.clear()
                self._shared_segments(run, a, b, segments)
                for bn, n, sm in segments:    # LogHistogram.add_bin(bn, n * c, sm * c) per tier
                    for k in range(num_tiers):
                        sums[k] += sm * weights[k]
                    if bn == cur_bin:
                        cur_gaps += n
                    else:
                        if cur_gaps:
                            run_bins.append(cur_bin)
                            run_gaps.append(cur_gaps)
                        cur_bin, cur_gaps = bn, n
            g = later_gaps[p - 1]
            for k in range(num_tiers):        # c requests' first gaps, added one by one
                total = sums[k]
                for _i in range(weights[k]):
                    total += g
                sums[k] = total
            bn = int((log(g) - log_min) * inv) if g > min_value else 0
            if bn == cur_bin:
                cur_gaps += 1
            else:
                if cur_gaps:
                    run_bins.append(cur_bin)
                    run_gaps.append(cur_gaps)
                cur_bin, cur_gaps = bn, 1
        run_bins.append(cur_bin)
        run_gaps.append(cur_gaps)
        gaps = 0
        for n in run_gaps:
            gaps += n
        for k in range(num_tiers):
            h = hists[tiers[k]]
            c = weights[k]
            counts = h.counts
            for j in range(len(run_bins)):
                bn = run_bins[j]
                counts[bn] = counts.get(bn, 0) + run_gaps[j] * c
            h.total += gaps * c
            h.sum = sums[k]

    def _clear_carries(self) -> None:
        """Forget both carries before a pass sets them. A method, not two assignments in `_end_run`: a type
        checker would narrow `self._carry` to None there, which a compiled build checks at run time."""
        self._carry = self._held_carry = None


    def _truncate_run(self, now: float, defer: bool = False) -> None:
        """End the current run after the iteration in flight at `now` (it cannot be interrupted).

        The state is brought up to now; with `defer` (a new request queued: nothing reads the running
        requests before the run ends) only a checkpoint is recorded, applied in the run's next pass.
        """
        run = self._run
        assert run is not None
        ends = run.ends
        if defer:
            j = self._ended_by(run, now)
            if j > (run.pending[-1][0] if run.pending else run.done):
                run.pending.append((j, j < len(ends)))
            keep = j + 1
        else:
            self.sync()
            keep = run.done + 1
        if keep < len(ends):
            self.busy_s -= ends[-1] - ends[keep - 1]
            self.iterations -= len(ends) - keep
            del ends[keep:]
            self._version += 1
            self.loop.at(ends[-1], RANK_ITERATION_END, self._end_run, self._version)

