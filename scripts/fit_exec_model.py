#!/usr/bin/env python3
"""Fit the execution-time coefficients from Vidur's profiles and write tierserve/hardware/data/exec_coefficients.json.

Usage: python scripts/fit_exec_model.py [--profiles DIR] [--out FILE]
(DIR defaults to shared/data/vidur/profiling, located by tierserve.core.paths.shared_data).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tierserve.core.paths import shared_data
from tierserve.hardware.calibration import fit_profile_tree, format_fit_summary
from tierserve.hardware.coefficients import DEFAULT_COEFFICIENTS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=DEFAULT_COEFFICIENTS)
    args = ap.parse_args(argv)
    root = args.profiles or shared_data("vidur", "profiling")
    if root is None:
        print("Vidur profiles not found (set TIERSERVE_SHARED or pass --profiles)", file=sys.stderr)
        return 2
    store, reports = fit_profile_tree(root)
    print(f"{'operator':34s} {'config':34s} {'n_train':>7s} {'n_test':>6s} {'test MAPE%':>10s}")
    for r in reports:
        print(f"{r.op:34s} {r.key:34s} {r.n_train:7d} {r.n_test:6d} {r.mape_test:10.2f}")
    print("\n" + format_fit_summary(store.meta["fit_error_pct"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    store.meta["source"] = "vidur/profiling (microsoft/vidur@7d47513 data, see shared/data/vidur/README.md)"
    store.save(args.out)
    print(f"\nwrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
