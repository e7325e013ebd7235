"""`tierserve reproduce contract`: the tierserve stack against every registered stack (issue 24)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from tierserve.cli.options import PoolWorkers, StudyExecutorByQuick
from tierserve.core.files import shown


def register(reproduce_app: typer.Typer) -> None:
    @reproduce_app.command("contract")
    def contract(quick: bool = typer.Option(False, "--quick", help="Short runs, one seed, three stacks: a smoke of "
                                                                   "every section (under a minute), not evidence."),
                 out: Path = typer.Option(Path("results/contract"), "--out", help="Folder for the report and JSON."),
                 executor: StudyExecutorByQuick = None,
                 sections: str = typer.Option(None, "--sections", help="Comma-separated subset of: default, "
                                                                       "capacity, steady, ktier, reasoning, "
                                                                       "qos_diurnal, ablation, sensitivity."),
                 workers: PoolWorkers = 2,
                 doc: Optional[Path] = typer.Option(None, "--doc", help="Also write the report into its section "
                                                        "('contract', 'contract quick') of this document (the "
                                                        "repository's docs/results/contract.md)."),
                 resume: bool = typer.Option(False, "--resume", help="Keep the sections an earlier run of the same "
                                                                     "study saved under --out; run the rest."),
                 merge: Optional[list[Path]] = typer.Option(None, "--merge", help="Run nothing: render one report "
                                                            "from these contract_results.json files of runs over "
                                                            "disjoint --sections (the first's sections win).")
                 ) -> None:
        """The default scenario (burst), capacity on the default mix, steady loads ρ = 0.5…1.1, seed 000's tier
        distributions, seed 001's reasoning mix, seed 003's QoS classes under a diurnal load, ablations and
        sensitivity — every stack at equal GPUs, stability verdicts, mean ± 95% over seeds."""
        from dataclasses import replace

        from rich.console import Console

        from tierserve.core import ConfigError
        from tierserve.experiments.contract import SECTIONS, Study, run_study
        study = Study.quick_study() if quick else Study()
        if sections:
            chosen = tuple(s.strip() for s in sections.split(",") if s.strip())
            bad = [s for s in chosen if s not in SECTIONS]
            if bad or not chosen:
                raise ConfigError("--sections", sections, ", ".join(SECTIONS))
            study = replace(study, sections=chosen)
        study = replace(study, workers=workers)
        console = Console(width=200)
        t0 = time.perf_counter()
        if merge:
            import json

            from tierserve.experiments.contract_report import merge_results, report
            from tierserve.core.files import read_mapping
            merged = merge_results([read_mapping(p, "--merge", json.loads, (ValueError,), "JSON") for p in merge])
            text = report(merged, study)
            out.mkdir(parents=True, exist_ok=True)
            (out / "contract_report.md").write_text(text)
            (out / "contract_results.json").write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
            if doc:
                from tierserve.experiments.contract import write_doc
                write_doc(doc, study, text)
            console.print(text, markup=False, highlight=False)
            console.print(f"merged {len(merge)} result file(s) into {shown(out)}/contract_report.md"
                          + (f" and {shown(doc)}" if doc else ""))
            return
        result = run_study(study, out, executor=executor or ("serial" if quick else "process"),
                           log=lambda msg: console.print(msg, markup=False, highlight=False), doc=doc,
                           resume=resume)
        console.print(result["markdown"], markup=False, highlight=False)
        console.print(f"wrote {shown(out)}/contract_report.md and contract_results.json"
                      + (f", {shown(doc)}" if doc else "") + f" in {time.perf_counter() - t0:.1f} s")
