"""sim_to_real: the step-time models fitted to the engine's iteration rows, their report, and the drift check
of the machine's speed within a run."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tierserve.core.outputs import write_text_atomic
from tierserve.experiments.sim_to_real.tables import BOOTSTRAP_SEED


def step_features(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    f = lambda k: np.array([float(r[k]) for r in rows])       # noqa: E731
    x = np.stack([np.ones(len(rows)), f("prefill_tokens"), f("decode_count"), f("prefill_attn_pairs"),
                  f("decode_context_sum")], axis=1)
    return x, f("measured_ms") * 1e-3


def fit_mean_step_time(rows: list[dict]) -> np.ndarray:
    """t = c0 + c1·P + c2·B + c3·pairs + c4·C by ordinary least squares (unbiased on the mean step time),
    coefficients kept >= 0 by dropping the most negative column and refitting."""
    from tierserve.hardware.calibration import fit_nonneg
    x, y = step_features([r for r in rows if not (r.get("exclude") or "").strip()])
    return fit_nonneg(x, y, relative=False)       # = tierserve calibrate --iterations --objective mean, all rows


def write_fit(coef: np.ndarray, path: Path, n_rows: int, source: str, rows: list[dict]) -> Path:
    """The fit as `tierserve calibrate --iterations` writes one, with the measured/predicted step-time ratio
    table of the same rows (`step_time_ratios`: what `step_time_variability` draws from)."""
    from tierserve.hardware.calibration import step_time_ratio_table
    keys = ("c0_s", "c_prefill_tok_s", "c_decode_tok_s", "c_pair_s", "c_ctx_s")
    x, y = step_features([r for r in rows if not (r.get("exclude") or "").strip()])
    write_text_atomic(path, json.dumps({**{k: float(c) for k, c in zip(keys, coef)}, "n_rows": n_rows,
                                        # on the fitted rows themselves (fit files require a finite MAPE)
                                        "mape_test": float(np.mean(np.abs(x @ coef - y) / y) * 100),
                                        "source": source, "step_time_ratios": step_time_ratio_table(y, x @ coef)},
                                       indent=1))
    return path


def fit_of(path: Path) -> np.ndarray:
    d = json.loads(path.read_text())
    return np.array([d[k] for k in ("c0_s", "c_prefill_tok_s", "c_decode_tok_s", "c_pair_s", "c_ctx_s")])


def step_model_report(name: str, rows: list[dict], fits: dict[str, np.ndarray]) -> list[str]:
    x, y = step_features(rows)
    decode_only = x[:, 1] == 0
    lines = [f"  step time on {name} ({len(y)} steps): measured mean {y.mean() * 1e3:.2f} ms, P50 "
             f"{np.median(y) * 1e3:.2f}, P90 {np.percentile(y, 90) * 1e3:.2f}, P99 {np.percentile(y, 99) * 1e3:.2f}"]
    for label, c in fits.items():
        p = x @ c
        lines.append(f"    {label:34s} predicted mean {p.mean() * 1e3:.2f} ms ({(p.mean() / y.mean() - 1) * 100:+.1f}% "
                     f"of measured; decode-only steps {(p[decode_only].sum() / y[decode_only].sum() - 1) * 100:+.1f}%, "
                     f"steps with prefill {(p[~decode_only].sum() / max(y[~decode_only].sum(), 1e-12) - 1) * 100:+.1f}%"
                     f"), MAPE {np.mean(np.abs(p - y) / y) * 100:.1f}%")
    return lines


SPEED_WINDOW_S = 1.0         # speed replay: the machine's measured speed per window of this length
SPEED_MIN_ROWS = 5           # a window with fewer logged steps keeps the previous window's factor
DRIFT_WINDOW_STEPS = 200   # steps per drift window (~2 s near capacity): a ratio's noise depends on steps, not time


def window_ratios(rows: list[dict], coef: np.ndarray, window_steps: int = DRIFT_WINDOW_STEPS
                  ) -> list[tuple[int, int, float]]:
    """Measured / predicted step time (Σ measured / Σ predicted: the simulator sums step times) in consecutive
    windows of `window_steps` logged steps (warm-up rows left out); a remainder shorter than a window joins the
    last one. Returns (first row, end row exclusive, ratio) per window, rows counted after the exclusion."""
    if window_steps < 1:
        raise ValueError(f"window_steps {window_steps}: at least 1")
    x, y = step_features([r for r in rows if not (r.get("exclude") or "").strip()])
    p = x @ np.asarray(coef, dtype=float)
    starts = list(range(0, len(y), window_steps))
    if len(starts) > 1 and len(y) - starts[-1] < window_steps:
        starts.pop()
    edges = starts + [len(y)]
    return [(a, b, float(y[a:b].sum() / p[a:b].sum())) for a, b in zip(edges, edges[1:]) if p[a:b].sum() > 0]


def window_spread(windows: list[tuple[int, int, float]]) -> float:
    """Largest over smallest window ratio (1.0 for fewer than two windows)."""
    r = [w[2] for w in windows]
    return max(r) / min(r) if len(r) >= 2 else 1.0


DRIFT_REFERENCE_DRAWS = 2000  # seeded draws of a run's window count from the calibration windows' deviations
DRIFT_REFERENCE_LEVEL = 95    # percentile of those draws' spread that a validation run must exceed to be flagged


def calibration_window_deviations(calibration_runs: dict[str, list[dict]], coef: np.ndarray,
                                  window_steps: int = DRIFT_WINDOW_STEPS) -> tuple[np.ndarray, dict[str, float]]:
    """The machine's own variation while it was measured for the model: each calibration run's window ratios
    (held-out fit) over that run's whole-run ratio, pooled; and each run's spread (max/min) — the runs with two
    or more windows, whose count `drift_threshold` needs."""
    devs, spreads = [], {}
    for name, rows in calibration_runs.items():
        windows = window_ratios(rows, coef, window_steps) if len(rows) >= 2 * window_steps else []
        if len(windows) < 2:
            continue
        x, y = step_features([r for r in rows if not (r.get("exclude") or "").strip()])
        whole = y.sum() / (x @ coef).sum()
        devs += [w[2] / whole for w in windows]
        spreads[name] = window_spread(windows)
    if len(devs) < 4:
        raise ValueError(f"calibration_window_deviations: {len(devs)} calibration windows of {window_steps} steps; "
                         f"need 4 or more")
    return np.asarray(devs), spreads


def drift_threshold(deviations: np.ndarray, n_windows: int, n_runs: int = 1, seed: int | None = None) -> float:
    """The spread (max/min) that `n_windows` windows reach by the calibration windows' own variation: the
    DRIFT_REFERENCE_LEVEL percentile of max/min over seeded draws of `n_windows` normal deviations with the
    calibration windows' standard deviation about their runs' ratios (`n_runs` runs: one degree of freedom
    each spent on the run's ratio). A normal model, not a resample: a resample cannot exceed the few calibration
    windows' own range, which a longer run's windows pass by chance. It grows with the window count."""
    dev = np.asarray(deviations, dtype=float)
    if len(dev) <= n_runs:
        raise ValueError(f"drift_threshold: {len(dev)} calibration windows for {n_runs} runs; need more windows")
    if n_windows < 2:
        return float("inf")
    sigma = float(np.sqrt(((dev - 1.0) ** 2).sum() / (len(dev) - n_runs)))
    rng = np.random.default_rng(BOOTSTRAP_SEED if seed is None else seed)
    draws = 1.0 + sigma * rng.standard_normal((DRIFT_REFERENCE_DRAWS, n_windows))
    return float(np.percentile(draws.max(axis=1) / draws.min(axis=1), DRIFT_REFERENCE_LEVEL))


def drift_check(label: str, rows: list[dict], fits: dict[str, np.ndarray], deviations: np.ndarray,
                n_calibration_runs: int, row_times_s: list[float] | None = None,
                window_steps: int = DRIFT_WINDOW_STEPS
                ) -> tuple[list[str], bool]:
    """Per fit, the validation run's window ratios: min and max and where (seconds from the run's first logged
    step, where `row_times_s` gives each row's end; else step numbers in the run); flagged when a fit's spread
    (max/min) exceeds what the calibration windows' own variation gives for as many windows (`drift_threshold`)."""
    lines, flagged = [], False
    kept = [k for k, r in enumerate(rows) if not (r.get("exclude") or "").strip()]

    def where(w: tuple[int, int, float]) -> str:
        if row_times_s is None or any(np.isnan(row_times_s[kept[i]]) for i in (w[0], w[1] - 1)):
            return f"steps {w[0]}-{w[1] - 1}"
        return f"{row_times_s[kept[w[0]]]:.1f}-{row_times_s[kept[w[1] - 1]]:.1f} s"

    cells = []
    for name, coef in fits.items():
        windows = window_ratios(rows, coef, window_steps)
        if not windows:
            lines.append(f"    drift, {name:14s} no logged steps")
            continue
        lo, hi = min(windows, key=lambda w: w[2]), max(windows, key=lambda w: w[2])
        spread = window_spread(windows)
        threshold = drift_threshold(deviations, len(windows), n_calibration_runs)
        flagged |= spread > threshold
        cells.append(f"{name} {spread:.3f} against {threshold:.3f}")
        lines.append(f"    drift, {name:14s} {len(windows):3d} windows of {window_steps} steps: measured/predicted "
                     f"min {lo[2]:.3f} ({where(lo)}), max {hi[2]:.3f} ({where(hi)}), spread max/min {spread:.3f}")
    lines.append(f"  drift verdict, {label}: {'DRIFTED' if flagged else 'steady'} — window spread " + ", ".join(cells)
                 + f" (the P{DRIFT_REFERENCE_LEVEL} spread of as many normal windows with the SD of the "
                   f"{n_calibration_runs} calibration runs' {len(deviations)} windows about their runs' ratios)")
    return lines, flagged
