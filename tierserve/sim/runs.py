# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""The records of work in flight on a replica: a decode run, its block-growth schedule, a chunk run; and the
two small helpers their passes share (a histogram bin flush, a batch's tier counts less its finished).

Owns: the data each run carries between its start and the pass that applies it. May not touch: a replica
(these records never read or change one; the rooms in decode_runs.py and chunk_runs.py do).
"""
from __future__ import annotations

from math import log

from tierserve.core import RequestState
from tierserve.core.histogram import LogHistogram


def _flush_bin(hists: list[LogHistogram], b: int, pend: list[int]) -> None:
    """Count pend[t] values in bin `b` of tier t's histogram (their sum is kept by the caller); zero pend."""
    for t, n in enumerate(pend):
        if n:
            counts = hists[t].counts
            counts[b] = counts.get(b, 0) + n
            hists[t].total += n
            pend[t] = 0


def _less(tier_counts: dict[int, int], finished: list[RequestState]) -> dict[int, int]:
    """Per-tier counts of a batch without its finished requests (tiers in the same order, empty ones gone)."""
    if not finished:
        return tier_counts
    counts = dict(tier_counts)
    for r in finished:
        counts[r.tier] -= 1
    return {t: c for t, c in counts.items() if c}


class DecodeRun:
    """A repeatable decode-only batch executing k iterations; `done` of them applied so far.

    `pending`: checkpoints (iterations ended, one in flight?) at which the run was read or cut but not yet
    applied; they are applied, in order and with the same arithmetic as one `_apply_run` each, in the
    next pass over the batch (a cut by an arrival then costs no pass of its own).
    """

    __slots__ = ("batch", "start_s", "ends", "done", "tier_counts", "pending", "applied_tokens", "block_growth")

    def __init__(self, batch: list[RequestState], start_s: float, ends: list[float],
                 tier_counts: dict[int, int]) -> None:
        self.batch = batch
        self.start_s = start_s
        self.ends = ends
        self.done = 0
        self.tier_counts = tier_counts
        self.pending: list[tuple[int, bool]] = []
        # Tokens of the run each request's blocks cover as applied (iteration 0's are given at the start).
        self.applied_tokens = 1
        self.block_growth: BlockGrowth | None = None    # built when first read (`Replica.used_blocks_now`)


class BlockGrowth:
    """The KV blocks a decode run's requests add as its iterations pass, counted without a pass over them.

    Request r, holding b blocks with c tokens computed when the run started, needs its next block once the
    run has covered s = b·bs − c + 1 of its tokens, then one every bs tokens; so the blocks added at count u
    are the requests whose s is u plus those added at u − bs. `total[u]`: blocks added from the state the
    schedule was built in (every s lies beyond it) up to u tokens; extended as far as it is read."""

    __slots__ = ("block_size", "starts", "steps", "total")

    def __init__(self, batch: list[RequestState], done: int, block_size: int) -> None:
        starts: dict[int, int] = {}
        for r in batch:
            s = r.num_blocks * block_size - (r.num_computed_tokens - done) + 1
            starts[s] = starts.get(s, 0) + 1
        self.block_size = block_size
        self.starts = starts
        self.steps = [0]
        self.total = [0]

    def added(self, tokens: int) -> int:
        total, steps, starts, bs = self.total, self.steps, self.starts, self.block_size
        u = len(total)
        while u <= tokens:
            step = starts.get(u, 0)
            if u > bs:
                step += steps[u - bs]
            steps.append(step)
            total.append(total[u - 1] + step)
            u += 1
        return total[tokens]


class ChunkRun:
    """Iterations of the same decodes beside one prefill's next chunks, started as one (`_continue_chunk`
    under a `repeats_prefill_chunk` policy): iteration j ends at ends[j], lasts durations[j] (as charged),
    runs chunks[j] prompt tokens and first allocates p_needs[j] blocks to the prefill. Iteration 0 is
    allocated and charged when the run starts; the rest is applied in one pass (`_chunks_catch_up`), after
    which the iteration in flight ends as an ordinary one. Each iteration still ends with its own event
    (`_chunks_tick`, scheduled when stepping would schedule it): `ended` counts them, and the event order —
    ties and the events statistic included — is stepping's."""

    __slots__ = ("batch", "start_s", "ends", "durations", "chunks", "p_needs", "ended")

    def __init__(self, batch: list[tuple[RequestState, int]], start_s: float, ends: list[float],
                 durations: list[float], chunks: list[int], p_needs: list[int]) -> None:
        self.batch = batch
        self.start_s = start_s
        self.ends = ends
        self.durations = durations
        self.chunks = chunks
        self.p_needs = p_needs
        self.ended = 0




class TokenGaps:
    """The token gaps of one pass over a batch, binned into each tier's histogram as `LogHistogram.add` would
    bin them one by one: requests that share a previous token time share a gap, binned once; a bin's counts
    are written back when the gap changes, each tier's sum (added in the pass's order) at `close`."""

    __slots__ = ("hists", "log_min", "inv", "min_value", "last_gap", "last_bin", "pend", "pend_any", "sums")

    def __init__(self, hists: list[LogHistogram]) -> None:
        h0 = hists[0]
        self.hists = hists
        self.log_min = h0._log_min
        self.inv = h0._inv_log_step
        self.min_value = h0.min_value
        self.last_gap = -1.0
        self.last_bin = 0
        self.pend = [0] * len(hists)          # counts of the current bin per tier
        self.pend_any = False
        self.sums = [h.sum for h in hists]

    def add(self, tier: int, gap: float) -> None:
        if gap != self.last_gap:
            if self.pend_any:
                _flush_bin(self.hists, self.last_bin, self.pend)
            self.last_gap = gap
            self.last_bin = int((log(gap) - self.log_min) * self.inv) if gap > self.min_value else 0
        self.pend[tier] += 1
        self.pend_any = True
        self.sums[tier] += gap

    def run(self, r: RequestState, first_end: float, shared_max: float, last: float) -> None:
        """`r` emitted each token of a run's iterations: its first gap (from its last token to `first_end`) is
        binned, its largest is that or `shared_max` (the run's own gaps), its last token came at `last`."""
        gap = first_end - r.last_token_s
        self.add(r.tier, gap)
        if shared_max > gap:
            gap = shared_max
        if gap > r.tbt_max_s:
            r.tbt_max_s = gap
        r.last_token_s = last

    def close(self) -> None:
        if self.pend_any:
            _flush_bin(self.hists, self.last_bin, self.pend)
        for h, total in zip(self.hists, self.sums):
            h.sum = total


def emit_token(r: RequestState, computed: int, now: float, gaps: TokenGaps) -> int:
    """The token an iteration ending at `now` emits for `r`, whose `computed` tokens are all it knew: its
    counts, its first-token time or its gap (into `gaps`) and largest gap. Returns the tokens it has left
    (by its true output length: the executor owns the truth; ≤ 0: it is finished)."""
    generated = r.num_generated + 1
    r.num_generated = generated
    r.num_tokens = computed + 1
    r.attained_tokens += 1
    if r.first_token_s < 0:
        r.first_token_s = now
    else:
        gap = now - r.last_token_s
        gaps.add(r.tier, gap)
        if gap > r.tbt_max_s:
            r.tbt_max_s = gap
    r.last_token_s = now
    return r._request.output_tokens - generated


def advance_decode(r: RequestState, tokens: int, spans: list[float], scheduled_s: float) -> int:
    """`r` decoded `tokens` tokens over iterations of a run that took `spans` seconds (added in order, as
    stepping adds them), the last scheduled at `scheduled_s`. Returns its tokens computed before them."""
    computed = r.num_computed_tokens
    r.num_computed_tokens = computed + tokens
    r.num_tokens += tokens
    r.num_generated += tokens
    r.attained_tokens += tokens
    r.service_tokens += tokens
    service = r.service_s
    for span in spans:
        service += span
    r.service_s = service
    r.last_scheduled_s = scheduled_s
    return computed


class NextSums:
    """Over the requests a pass leaves decoding: what their next iteration needs, gathered as the pass goes —
    how many, the blocks each must add first, Σ (computed + 1), and the fewest tokens any has left."""

    __slots__ = ("count", "grow", "ctx", "rem_min")

    def __init__(self) -> None:
        self.count = 0
        self.grow: list[tuple[RequestState, int]] = []
        self.ctx = 0
        self.rem_min = 1 << 62

    def add(self, r: RequestState, computed: int, blocks: int, block_size: int, rem: int) -> None:
        """`r` emitted a token with `computed` tokens computed, holds `blocks` and has `rem` tokens left."""
        self.count += 1
        self.ctx += computed + 1
        if rem < self.rem_min:
            self.rem_min = rem
        need = -(-(computed + 1) // block_size) - blocks
        if need > 0:
            self.grow.append((r, need))
