"""sim_to_real: the engine's iteration-log rows assigned to the runs whose steps they are, by step ends."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tierserve.experiments.sim_to_real.boundaries import step_ends
from tierserve.experiments.sim_to_real.records import iteration_rows


ALIGN_TOL_MS = 0.5      # a logged step time vs the gap between its token stamps: stamp jitter and µs rounding
ALIGN_TOL_REL = 0.02    # ... or 2% of the gap, whichever is larger (long steps carry more stamp jitter)
ALIGN_LOOKAHEAD = 4     # gaps read ahead to choose between readings of one gap
ALIGN_MISS_MS = 1.0     # lookahead cost of a gap its row does not fit
ALIGN_MAX_ROWS = 3      # rows one stamp gap can hold: up to two tokenless prefill chunks before the step with a token
ALIGN_PROBE_GAPS = 50   # stamp gaps walked to score a candidate start row
ALIGN_SEARCH_ROWS = 600 # candidate start rows after the previous run's last row (warm-up steps, tokenless chunks)


def _gap_matches(measured_ms: float, gap_ms: float) -> bool:
    return abs(measured_ms - gap_ms) <= max(ALIGN_TOL_MS, ALIGN_TOL_REL * gap_ms)


def walk_rows(measured_ms: np.ndarray, ends: np.ndarray, first: int, max_gaps: int | None = None) -> dict:
    """Walk the iteration-log rows from `first` (the row after the one that ended at ends[0]) along the stamp gaps
    of one run's step ends. A busy gap holds 1..ALIGN_MAX_ROWS rows whose times sum to it (the extra rows are
    tokenless prefill chunks); a gap longer than its rows is idle time before them. Where several readings fit,
    the one under which the next ALIGN_LOOKAHEAD gaps match best wins (5 ms decode steps differ by less than the
    tolerance, so one gap alone can mislead). A row longer than its gap is unmatched (skipped, counted). Returns
    the last row walked (the one ending at ends[-1]), each walked row's end time (epoch s) and counts."""
    m, gaps = measured_ms, np.diff(ends) * 1e3
    n_gaps = len(gaps) if max_gaps is None else min(len(gaps), max_gaps)
    row_end: dict[int, float] = {first - 1: float(ends[0])} if first >= 1 else {}
    counts = {"matched_gaps": 0, "idle_gaps": 0, "unmatched_rows": 0, "unmatched_gaps": 0}

    def readings(j0: int, k0: int) -> list[tuple[int, bool]]:   # (rows, idle) that can fill gap k0 from row j0
        out, total = [], 0.0
        for n in range(1, ALIGN_MAX_ROWS + 1):
            if j0 + n > len(m):
                break
            total += m[j0 + n - 1]
            if _gap_matches(total, gaps[k0]):
                out.append((n, False))
            elif total < gaps[k0]:
                out.append((n, True))
            else:
                break
        return sorted(out, key=lambda r: r[1])          # busy readings first

    def lookahead_cost(j0: int, k0: int) -> float:      # |error| (ms) of the next gaps read one row each
        cost = 0.0
        for d in range(ALIGN_LOOKAHEAD):
            if k0 + d >= n_gaps or j0 + d >= len(m):
                break
            err = m[j0 + d] - gaps[k0 + d]
            cost += abs(err) if _gap_matches(m[j0 + d], gaps[k0 + d]) else (0.0 if err < 0 else ALIGN_MISS_MS)
        return cost

    j, k = first, 0
    while k < n_gaps and j < len(m):
        options = readings(j, k)
        if options:
            n, idle = min(options, key=lambda r: (lookahead_cost(j + r[0], k + 1), r[1], r[0]))
            t = float(ends[k + 1])
            for jj in range(j + n - 1, j - 1, -1):
                row_end[jj] = t
                t -= m[jj] * 1e-3
            counts["idle_gaps" if idle else "matched_gaps"] += 1
            j, k = j + n, k + 1
            continue
        for skip in range(1, 6):                # a row longer than its gap: rows the stamps do not show
            if j + skip < len(m) and _gap_matches(m[j + skip], gaps[k]):
                counts["unmatched_rows"] += skip
                j += skip
                break
        else:                                   # a stamp gap no row fits
            counts["unmatched_gaps"] += 1
            k += 1
    return {"last": j - 1, "row_end": row_end, **counts}


def assign_rows_by_step_ends(rows: list[dict], records_by_run: dict[str, list[dict]]) -> tuple[dict, dict, list[int]]:
    """Assign the engine's iteration-log rows (in log order) to the runs whose steps they are, by matching the
    logged step times with the gaps between each run's step ends (`step_ends` of its request records), not by
    counting rows when the run ended: the log may be flushed late. Runs are taken in time order; each run's
    rows are those after the previous run's last step through the row that ended at its own last step end (the
    rows before its first token are its prefill chunks). Returns run -> row indices, run -> match counts (or an
    'error' for a run whose steps match no rows; it gets none), and the row indices no run claims."""
    m = np.array([float(r["measured_ms"]) for r in rows])
    ends_by_run = {name: step_ends(recs) for name, recs in records_by_run.items()}
    order = sorted((name for name, e in ends_by_run.items() if len(e)), key=lambda name: ends_by_run[name][0])
    assigned: dict[str, list[int]] = {name: [] for name in records_by_run}
    report: dict[str, dict] = {name: {"error": "no step ends in its request records"}
                               for name, e in ends_by_run.items() if not len(e)}
    cursor = 0                                   # the first row not yet claimed
    for name in order:
        ends = ends_by_run[name]
        probe = min(ALIGN_PROBE_GAPS, len(ends) - 1)
        best, best_first = -1, None
        for first in range(cursor + 1, min(len(m), cursor + ALIGN_SEARCH_ROWS) + 1):
            walk = walk_rows(m, ends, first, probe) if probe else {"matched_gaps": 1, "idle_gaps": 0}
            walk.setdefault("unmatched_rows", 0)
            walk.setdefault("unmatched_gaps", 0)
            # skipped rows and gaps count against a start: else the row before the true start wins by skipping one
            score = walk["matched_gaps"] + walk["idle_gaps"] - walk["unmatched_rows"] - walk["unmatched_gaps"]
            if score > best:
                best, best_first = score, first
                if score == probe:
                    break
        if best_first is None or (probe and best < max(2, probe // 4)):
            report[name] = {"error": f"its {len(ends)} step ends match no rows after row {cursor} "
                                     f"(best {best} of {probe} gaps)"}
            continue
        walk = walk_rows(m, ends, best_first)
        for i in range(best_first - 2, cursor - 1, -1):     # tokenless chunks before the first token: back to back
            walk["row_end"][i] = walk["row_end"][i + 1] - m[i + 1] * 1e-3
        assigned[name] = list(range(cursor, walk["last"] + 1))
        report[name] = {k: v for k, v in walk.items() if k != "row_end"}
        report[name]["row_end"] = walk["row_end"]
        cursor = walk["last"] + 1
    return assigned, report, list(range(cursor, len(rows)))


def split_calibration_rows(run: dict) -> tuple[list[dict], list[dict]]:
    """A load's saved calibration rows are the run before the validation run and the run after, concatenated:
    split them at the validation run's first engine step."""
    if not run["rows"]:
        return run["cal_rows"], []
    first = int(run["rows"][0]["step"])
    n_before = sum(int(r["step"]) < first for r in run["cal_rows"])
    return run["cal_rows"][:n_before], run["cal_rows"][n_before:]


def realign_saved_rows(out: Path, saved: dict) -> tuple[dict, list[str]]:
    """`saved` with each run's iteration rows re-assigned by step ends (`assign_rows_by_step_ends`) from the
    full iterations.csv; the lines reporting how many rows moved per run and which rows no run claims. Any run
    the analysis uses that cannot be aligned keeps its saved (count-based) rows, said so."""
    rows = iteration_rows(out)
    recs = [json.loads(line) for line in (out / "requests.jsonl").open() if line.strip()]
    by_run: dict[str, list[dict]] = {}
    for r in recs:
        by_run.setdefault(str(r["xargs"].get("run", "")), []).append(r)
    assigned, report, unclaimed = assign_rows_by_step_ends(rows, by_run)
    step_id = lambda r: int(r["step"])         # noqa: E731  the engine's step counter: unique per row
    lines = ["iteration rows re-assigned to runs by step ends (the logged step times matched to each run's token "
             f"stamp gaps; {len(rows)} rows):"]
    saved = {**saved, "runs": {k: dict(v) for k, v in saved["runs"].items()}}
    saved["row_ends"] = {}

    def replace(name: str, old: list[dict]) -> list[dict]:
        rep = report.get(name, {"error": "no request records"})
        if "error" in rep:
            lines.append(f"  {name:32s} NOT re-assigned ({rep['error']}): keeps its {len(old)} rows by count")
            return old
        new = [rows[i] for i in assigned[name]]
        old_ids, new_ids = {step_id(r) for r in old}, {step_id(r) for r in new}
        lines.append(f"  {name:32s} {len(old):5d} rows by count -> {len(new):5d} by step ends: "
                     f"{len(old_ids - new_ids):4d} moved out (other runs' steps), {len(new_ids - old_ids):4d} moved "
                     f"in; "
                     f"stamp gaps matched {rep['matched_gaps']}, idle {rep['idle_gaps']}, unmatched "
                     f"{rep['unmatched_gaps']}; rows matching no gap {rep['unmatched_rows']}")
        saved["row_ends"][name] = {step_id(rows[i]): t for i, t in rep["row_end"].items() if i in assigned[name]}
        return new

    if "capacity_rows" in saved:
        saved["capacity_rows"] = replace("capacity", saved["capacity_rows"])
    for label, run in saved["runs"].items():
        # the saved calibration rows are the run before and the run after, concatenated: split at the validation
        split = split_calibration_rows(run)
        run["rows"] = replace(label, run["rows"])
        run["cal_rows"] = [r for name, old in zip(run["cal_runs"], split) for r in replace(name, old)]
    for name in sorted(set(by_run) - {"capacity"} - set(saved["runs"])
                       - {c for run in saved["runs"].values() for c in run["cal_runs"]}):
        rep = report.get(name, {})
        lines.append(f"  {name:32s} {len(assigned.get(name, [])):5d} rows by step ends (not analysed)"
                     + (f" — {rep['error']}" if "error" in rep else ""))
    lines.append(f"  rows no run's steps claim (after the last run's last step end): {len(unclaimed)}"
                 + (f", engine steps {step_id(rows[unclaimed[0]])}..{step_id(rows[unclaimed[-1]])}" if unclaimed
                    else ""))
    return saved, lines
