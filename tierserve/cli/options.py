"""The options several `tierserve` commands share, declared once: each is a type to annotate a command's
parameter with (`seed: Seed = None`), so every command that takes it (`simulate`, `compare`, `hardware`,
`calibrate`, `sweep`, `plan` and the reproductions) spells a flag, its short form, its bounds and its help the
same way. The default stays in the command's signature. An option whose help names what one command does with
it (a reproduction's `--out`, `--quick`, `--doc`) stays in that command."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

STEADY_HELP = "Statistics over the steady-state window only (first and last --drop-fraction of arrivals dropped)."
DROP_HELP = "With --steady-state: fraction of arrivals dropped at each end."
SEEDS_HELP = "Run this many seeds (the scenario's seed and the ones after it); show mean ± 95% interval."

# the scenario
ScenarioFile = Annotated[Optional[Path], typer.Option("--config", "-c", help="Scenario YAML (see examples/).")]
Replicas = Annotated[Optional[int], typer.Option("--replicas", help="Number of replicas.")]
Rate = Annotated[Optional[float], typer.Option("--rate", help="Arrival rate (req/s), Poisson.")]
NumRequests = Annotated[Optional[int], typer.Option("--num-requests", "-n", help="Number of requests.")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Random seed.")]
# the hardware
Model = Annotated[Optional[str], typer.Option("--model", help="Model name or alias, e.g. Llama-3-8B.")]
Gpu = Annotated[Optional[str], typer.Option("--gpu", help="GPU name or alias: A100-80GB, H100-80GB, H200.")]
Tp = Annotated[Optional[int], typer.Option("--tp", help="Tensor-parallel degree.")]
# how the runs run and what their statistics cover
Executor = Annotated[str, typer.Option("--executor", help="serial | process | ray (for several stacks or seeds).")]
OutFolder = Annotated[Optional[Path], typer.Option(
    "--out", "-o", help="Write requests.csv and summary.json here (one folder per stack and seed when there are "
                        "several), published whole with manifest.json.")]
SteadyState = Annotated[bool, typer.Option("--steady-state", help=STEADY_HELP)]
DropFraction = Annotated[float, typer.Option("--drop-fraction", help=DROP_HELP)]
Seeds = Annotated[int, typer.Option("--seeds", min=1, help=SEEDS_HELP)]

# the long jobs: a sweep, a plan, the reproductions
PoolExecutor = Annotated[str, typer.Option("--executor", help="process | serial | ray.")]
PoolWorkers = Annotated[Optional[int], typer.Option("--workers", min=1, help="Process-pool size.")]
StudyExecutor = Annotated[str, typer.Option("--executor", help="process | serial | ray")]
StudyExecutorByQuick = Annotated[Optional[str], typer.Option(
    "--executor", help="process | serial | ray (default: serial with --quick, else process)")]
StudySeeds = Annotated[int, typer.Option("--seeds", min=3, help="Seeds per point (≥ 3: intervals need them).")]
