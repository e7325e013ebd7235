"""What both calibrations (operator profiles, measured iteration logs) share: CSV columns read with errors
naming the file and column, the fixed held-out split, MAPE, and non-negative least squares. csv + numpy only."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import numpy as np

from tierserve.hardware.fits import ProfileError

HOLDOUT_FRACTION = 0.2
_SEED = 1234


def read_rows(path: str | Path, required: Iterable[str]) -> list[dict[str, str]]:
    """Rows of a CSV as dicts; error naming the file/column when it is missing, lacks a column or is empty."""
    from tierserve.core.files import read_csv_table  # the input layer: UTF-8, no duplicate columns or ragged rows
    p = Path(path)
    if not p.is_file():
        raise ProfileError(p, None, "file not found")
    table = read_csv_table(p, max_rows=None, allow_no_rows=True)
    for col in required:
        if col not in table.header:
            raise ProfileError(p, col, f"missing required column (header has {len(table.header)} columns)")
    if not table.rows:
        raise ProfileError(p, None, "no data rows")
    return [dict(zip(table.header, r)) for r in table.rows]


def column(rows: list[dict[str, str]], name: str, source: str | Path) -> np.ndarray:
    """A numeric column; blank cells become NaN, anything else unparsable is an error naming the column."""
    out = np.empty(len(rows))
    for i, r in enumerate(rows):
        v = r.get(name, "")
        if v is None or v == "":
            out[i] = math.nan
            continue
        try:
            if "_" in v:                  # float() reads 1_000; a profile cell must be a plain number
                raise ValueError(v)
            out[i] = float(v)
        except ValueError:
            raise ProfileError(source, name, f"row {i + 2}: {v!r} is not a number") from None
    return out


def int_column(rows: list[dict[str, str]], name: str, source: str | Path) -> np.ndarray:
    """A column of counts: integral values (`2` or `2.0`, as Vidur writes them) as ints; a blank or a
    non-integral cell (`2.5`) is an error naming the row and the column."""
    values = column(rows, name, source)
    bad = ~np.isfinite(values) | (values != np.round(values))
    if bad.any():
        i = int(np.argmax(bad))
        raise ProfileError(source, name, f"row {i + 2}: {rows[i].get(name)!r} is not an integer")
    return values.astype(int)


def holdout_mask(n: int) -> np.ndarray:
    """True for the held-out rows (fixed seed, so reports are reproducible)."""
    rng = np.random.default_rng(_SEED)
    return rng.random(n) < HOLDOUT_FRACTION


def mape(pred: np.ndarray, meas: np.ndarray) -> float:
    m = meas > 0
    return float(np.mean(np.abs(pred[m] - meas[m]) / meas[m]) * 100.0) if m.any() else math.nan


def fit_nonneg(features: np.ndarray, ms: np.ndarray, relative: bool = True) -> np.ndarray:
    """Least squares — on relative error, or plain (`relative=False`: unbiased on the mean, which a simulator
    summing iteration times needs when times are skewed) — with columns whose coefficient goes negative
    dropped (tiny NNLS)."""
    w = 1.0 / np.maximum(ms, 1e-6) if relative else np.ones_like(ms)
    active = list(range(features.shape[1]))
    coef = np.zeros(features.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(features[:, active] * w[:, None], ms * w, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef
