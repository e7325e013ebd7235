"""`RequestTable.to_csv` joins rows itself when no field needs quoting: its bytes must be exactly what the
csv module writes (QUOTE_MINIMAL, "\\r\\n", floats as repr), quoting or not, NaN, -0.0, repeated columns."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from tierserve.metrics.records import COLUMNS, RequestTable


def csv_module_bytes(table: RequestTable, path) -> bytes:
    text_cols = []
    for name, dtype in COLUMNS.items():
        col = table[name].tolist()
        text_cols.append(list(map(repr, col)) if dtype is np.float64 else col)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS.keys())
        w.writerows(zip(*text_cols))
    return path.read_bytes()


TEXTS = {"plain": ["", "a", "x y", "é", "needs 12 KV blocks (prompt+output = 40 tokens)"],
         "quoted": ["", 'q"uote', "a,b", "line\nbreak", "cr\rhere"],
         "quote_only": ["", 'say "hi"'], "comma_only": ["a,b"], "newline_only": ["two\nlines"]}


@pytest.mark.parametrize("n", [0, 1, 57])
@pytest.mark.parametrize("texts", sorted(TEXTS))
@pytest.mark.parametrize("floats", ["mixed", "all_nan", "repeated"])
def test_to_csv_writes_what_the_csv_module_writes(tmp_path, n, texts, floats):
    rng = np.random.default_rng(n)
    base = rng.normal(size=n) * 1e3
    base[::7] = np.nan
    base[1::11] = -0.0
    cols = {}
    for i, (name, dtype) in enumerate(COLUMNS.items()):
        if dtype is object:
            cols[name] = [TEXTS[texts][(j + i) % len(TEXTS[texts])] for j in range(n)]
        elif dtype is np.float64:
            cols[name] = (np.full(n, np.nan) if floats == "all_nan" else base.copy() if floats == "repeated"
                          else rng.normal(size=n) * 10.0 ** rng.integers(-9, 9, size=n))
        else:
            cols[name] = rng.integers(-3, 1000, size=n)
    table = RequestTable(cols)
    ours = table.to_csv(tmp_path / "ours.csv").read_bytes()
    assert ours == csv_module_bytes(table, tmp_path / "csv.csv")
    assert RequestTable.from_csv(tmp_path / "ours.csv")["id"].tolist() == table["id"].tolist()
