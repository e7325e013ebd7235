#!/usr/bin/env python3
"""Sim-to-real: one policy on a real vLLM-CPU engine and in the simulator, same trace, per-tier latencies.

    nice -n -10 python benchmarks/sim_to_real.py --pin [--policy vllm_priority] [--seed 1] [--out DIR]
        [--model-shape 4x512] [--requests 200] [--calibration-requests 100] [--light 0.25] [--heavy 0.8]
    python benchmarks/sim_to_real.py --out DIR --reanalyse
    python benchmarks/sim_to_real.py --aggregate DIR1 DIR2 DIR3

The entry only: the protocol, the models and every table are `tierserve.experiments.sim_to_real` (its
docstring says what each module does). The names the tests read are re-exported here.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tierserve.experiments.sim_to_real.aggregate import bracket_verdict  # noqa: E402,F401
from tierserve.experiments.sim_to_real.alignment import assign_rows_by_step_ends  # noqa: E402,F401
from tierserve.experiments.sim_to_real.boundaries import (engine_entry, engine_side_inputs,  # noqa: E402,F401
                                                          step_ends)
from tierserve.experiments.sim_to_real.cli import main  # noqa: E402
from tierserve.experiments.sim_to_real.simulator import speed_windows  # noqa: E402,F401
from tierserve.experiments.sim_to_real.step_model import (calibration_window_deviations,  # noqa: E402,F401
                                                          drift_check, drift_threshold, window_ratios)
from tierserve.experiments.sim_to_real.tables import bootstrap_quantile_ci  # noqa: E402,F401

if __name__ == "__main__":
    raise SystemExit(main())
