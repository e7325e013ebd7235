"""sim_to_real: where the engine-side comparison starts each request (`engine_entry`), the frontend's delays
around the engine, and the step ends the engine's request log shows."""
from __future__ import annotations

import numpy as np


def frontend_delays(real: list[dict], eng: dict[int, dict]) -> np.ndarray:
    """Per request (seconds): client send -> vLLM's arrival stamp in the API server (`in`: HTTP, request
    parsing), engine first token -> client (`out_first`: IPC, detokenisation, SSE, HTTP), engine last token ->
    client (`out_last`); rows in trace order. The stamp -> engine-queue part is left to the engine side: it
    holds the wait for the step in progress, which the simulator models itself."""
    rows = [(eng[r["i"]]["arrival_s"] - r["sent_s"], r["first_s"] - eng[r["i"]]["first_token_s"],
             r["last_s"] - eng[r["i"]]["finish_s"]) for r in sorted(real, key=lambda r: r["i"]) if r["i"] in eng]
    return np.array(rows, dtype=float).reshape(-1, 3)


BOUNDARIES = ("stamp", "queue", "core")
BUSY_GAP_S = 1e-3       # queued this soon after a step's end: it waited for that step (idle engines drain at once)
STEP_MERGE_S = 1e-3     # token stamps closer than this are one step's (the shortest logged step is 3.4 ms)


def step_ends(records) -> np.ndarray:
    """Sorted epoch times at which the engine's steps ended, as its request log shows them: each token's delivery
    (first token + the gaps; the tokens of one step share one stamp, so 0 ms gaps add nothing). A request's last
    token is stamped when it is freed, 0.2-0.4 ms before the step's other tokens: merged with them. A step that
    delivered no token (a lone prompt's first chunk) is missing."""
    ends = []
    for e in records:
        t = e["first_token_s"]
        ends.append(t)
        for gap_ms in e["gaps_ms"]:
            if gap_ms > 0:
                t += gap_ms * 1e-3
                ends.append(t)
    if not ends:
        return np.zeros(0)
    t = np.sort(np.asarray(ends, dtype=float))
    # one step's stamps differ by the gaps' 1 µs rounding, summed; steps last >= 3 ms: stamps < 1 ms apart are one step
    last_of_step = np.append(np.diff(t) > STEP_MERGE_S, True)
    return t[last_of_step]


def engine_entry(records: dict, boundary: str) -> dict:
    """Per request (trace index -> epoch s), the moment the engine-side comparison starts: the simulated engine
    receives the request then, and the real latencies are measured from it.

    'stamp': vLLM's arrival stamp in the API server (before tokenisation, IPC to the engine core, and the wait for
    the step in progress).
    'queue': entry into the engine core's scheduler queue (`queued_s`). The core drains its input queue only
    between steps, so this is the first step boundary at or after the request reached the core: the LATEST the
    engine can have received it (the real wait for the step in progress is already behind it).
    'core': the EARLIEST it can have reached the core: `queued_s` where the core was idle (it drains at once),
    else the later of the stamp and the end of the step before the one it waited for (had it been in the core's
    input queue then, that drain would have taken it); for a step whose end is not logged, its start (a request's
    `first_scheduled_s`) less BUSY_GAP_S."""
    if boundary == "stamp":
        return {i: e["arrival_s"] for i, e in records.items()}
    if boundary == "queue":
        return {i: e["queued_s"] for i, e in records.items()}
    if boundary != "core":
        raise ValueError(f"boundary {boundary!r}: one of {', '.join(BOUNDARIES)}")
    ends = step_ends(records.values())
    starts = np.sort([e["first_scheduled_s"] for e in records.values() if e["first_scheduled_s"] > 0])
    out = {}
    for i, e in records.items():
        queued = e["queued_s"]
        k = int(np.searchsorted(ends, queued, side="right")) - 1     # the last step end at or before it
        last_end = ends[k] if k >= 0 else -np.inf
        j = int(np.searchsorted(starts, queued, side="left")) - 1    # the last step start before it
        if queued - last_end <= BUSY_GAP_S:
            before = ends[k - 1] if k >= 1 else -np.inf
        elif j >= 0 and starts[j] > last_end + BUSY_GAP_S:
            before = starts[j] - BUSY_GAP_S                     # a step in progress whose end no token shows
        else:
            out[i] = queued                                     # idle engine core: it took the request at once
            continue
        out[i] = min(queued, max(e["arrival_s"], before))
    return out


def engine_latencies(records: dict, entry: dict) -> list[dict]:
    """Real engine-side latencies measured from `entry` (trace index -> epoch s): TTFT, TTLT and the token gaps."""
    return [{"tier": e["tier"], "ttft": e["first_token_s"] - entry[i], "ttlt": e["finish_s"] - entry[i],
             "tbt": [g * 1e-3 for g in e["gaps_ms"]]} for i, e in records.items()]


def engine_side_inputs(trace: list[dict], records: dict, entry: dict) -> tuple[list[dict], list[dict]]:
    """The engine-side comparison at one boundary: the trace as the simulated engine receives it (each request
    at its `entry`, seconds from the first) and the real latencies measured from the same moments."""
    e0 = min(entry.values())
    return [{**q, "arrival_s": entry[q["i"]] - e0} for q in trace], engine_latencies(records, entry)


def step_in_progress_wait(rows: list[dict], busy_fraction: float) -> float:
    """Mean wait (s) for the step in progress of a request arriving at a random moment: the residual of a
    length-biased step, Σ t² / (2 Σ t) over the run's measured step times, times the share of requests that
    found the engine busy. The real engine's part of stamp -> queue that is not IPC, on average."""
    t = np.array([float(r["measured_ms"]) * 1e-3 for r in rows])
    return float((t ** 2).sum() / (2 * t.sum()) * busy_fraction) if len(t) else 0.0
