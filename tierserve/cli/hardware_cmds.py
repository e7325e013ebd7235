"""`tierserve hardware` (known models/GPUs, KV capacity, predicted times) and `tierserve calibrate`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from tierserve.cli.options import Gpu, Model, Tp
from tierserve.core.errors import TierserveError

# Canonical batch shapes: (label, prefill tokens, prefill context, decodes, context per decode)
CANONICAL_SHAPES: tuple[tuple[str, int, int, int, int], ...] = (
    ("prefill 512", 512, 0, 0, 0),
    ("prefill 2048", 2048, 0, 0, 0),
    ("chunk 512 @ctx 2048", 512, 2048, 0, 0),
    ("decode b1 ctx 1024", 0, 0, 1, 1024),
    ("decode b32 ctx 1024", 0, 0, 32, 1024),
    ("decode b128 ctx 2048", 0, 0, 128, 2048),
    ("chunk 512 + 32 decodes ctx 1024", 512, 0, 32, 1024),
)


def _list_known(console: Console) -> None:
    from tierserve.hardware.specs import known_gpus, known_models
    t = Table(title="Models")
    for c in ("name", "layers", "hidden", "q/kv heads", "params (B)", "max len", "aliases"):
        t.add_column(c)
    for m in known_models():
        t.add_row(m.name, str(m.num_layers), str(m.hidden), f"{m.num_q_heads}/{m.num_kv_heads}",
                  f"{m.param_count / 1e9:.2f}", str(m.max_model_len), ", ".join(m.aliases))
    console.print(t)
    t = Table(title="GPUs")
    for c in ("name", "fp16 TFLOP/s", "memory GiB", "HBM GB/s", "PCIe GB/s", "NVLink GB/s", "aliases"):
        t.add_column(c)
    for g in known_gpus():
        t.add_row(g.name, f"{g.peak_tflops:.0f}", f"{g.memory_gb:.0f}", f"{g.hbm_gbytes_s:.0f}", f"{g.pcie_gbytes_s:.0f}",
                  f"{g.nvlink_gbytes_s:.0f}", ", ".join(g.aliases))
    console.print(t)


def _describe(console: Console, model: str, gpu: str, tp: int, calibrated: bool, mode: str) -> None:
    from tierserve.hardware.exec_model import build_execution_model, prefill_attention_pairs
    from tierserve.hardware.memory import kv_bytes_per_token, kv_capacity_blocks
    from tierserve.hardware.specs import engine_defaults, get_gpu, get_model
    m, g = get_model(model), get_gpu(gpu)
    blocks = kv_capacity_blocks(m, g, tp)
    em = build_execution_model(m.name, g.name, tp, calibrated=calibrated, mode=mode)
    budget, seqs = engine_defaults(g)
    console.print(f"[bold]{m.name}[/] on {tp}x {g.name}: KV {kv_bytes_per_token(m, tp)} B/token/GPU, "
                  f"{blocks} blocks of 16 = {blocks * 16:,} tokens; vLLM defaults {budget} tokens, {seqs} seqs")
    for n in em.notes:
        console.print(f"  source: {n}")
    what = "LM head and per-iteration overhead included" if mode == "physical" else "Vidur parity: no LM head/overhead"
    t = Table(title=f"Predicted iteration time (whole model, {mode} mode: {what})")
    for c in ("shape", "ms", "tokens/s"):
        t.add_column(c, justify="right")
    for label, p, pctx, b, ctx in CANONICAL_SHAPES:
        s = em.iteration_time(p, prefill_attention_pairs(p, pctx) if p else 0.0, b, b * ctx)
        t.add_row(label, f"{s * 1e3:.2f}", f"{(p + b) / s:,.0f}")
    console.print(t)


def _print_step_ratios(console, ratios: list[float]) -> None:
    """The measured/predicted step-time table the fit records (what `step_time_variability` draws from)."""
    if not ratios:
        console.print("no step-time ratio table (fewer rows than its 64 values)")
        return
    import numpy as np
    r = np.asarray(ratios)
    console.print(f"step-time ratio table ({len(r)} values, for cluster.replica.step_time_variability): mean "
                  f"{r.mean():.3f}, CV {r.std() / r.mean():.3f}, P10/P90 {np.percentile(r, 10):.2f}/"
                  f"{np.percentile(r, 90):.2f}")


def _print_physical_fit(console: Console, fit) -> None:
    """Fitted parameters, then every logged iteration: measured, physical-only, fitted, leave-one-out."""
    console.print(f"physical fit of {fit.n_rows} iterations for {fit.model}/{fit.gpu}/tp{fit.tp}:")
    console.print(f"  per-iteration overhead   {fit.overhead_ms:8.3f} ms")
    console.print(f"  GEMM FLOP efficiency     {fit.eff_gemm_flop:8.3f} of peak")
    console.print(f"  attention FLOP efficiency{fit.eff_attn_flop:8.3f} of peak")
    console.print(f"  HBM efficiency           {fit.eff_hbm:8.3f} (held fixed: not separable from the overhead here)")
    console.print(f"  per decode sequence      {fit.per_seq_ms:8.3f} ms (constant-cost fit)")
    console.print("  decode cost by batch size (ms): "
                  + ", ".join(f"B={b}: {c:.2f}" for b, c in zip(fit.decode_batch_knots, fit.decode_cost_ms)))
    t = Table(title="Measured vs calibrated (ms; errors %)")
    for c in ("prefill", "decodes", "measured", "physical", "err", "fitted", "err", "LOO err", "excl."):
        t.add_column(c, justify="right")
    for p in fit.points:
        loo = "" if p["loo_err_pct"] is None else f"{p['loo_err_pct']:+.1f}"
        t.add_row(str(p["prefill_tokens"]), str(p["decode_count"]), f"{p['measured_ms']:.1f}",
                  f"{p['physical_ms']:.1f}", f"{p['physical_err_pct']:+.1f}", f"{p['fitted_ms']:.1f}",
                  f"{p['err_pct']:+.1f}", loo, "yes" if p["exclude"] else "")
    console.print(t)
    for p in fit.points:
        if p["exclude"]:
            console.print(f"excluded from the fit: prefill {p['prefill_tokens']} / {p['decode_count']} decodes "
                          f"({p['err_pct']:+.1f}%): {p['exclude']}")
    console.print(f"largest error over fitted rows: {fit.max_abs_err_pct():.2f}%")
    _print_leave_shapes_out(console, fit)


def _print_leave_shapes_out(console: Console, fit) -> None:
    """Held-out error: each shape predicted by a fit redone without it (in-sample errors flatter the fit)."""
    from tierserve.hardware.iteration_calibration import leave_shapes_out
    rows = leave_shapes_out(fit.source, fit.model, fit.gpu, fit.tp)
    errs = [abs(r["err_pct"]) for r in rows]
    console.print(f"leave-shapes-out (held-out) error over {len(rows)} rows, each refitted without its shape: "
                  f"MAPE {sum(errs) / len(errs):.2f}%, largest {max(errs):.2f}%; "
                  + ", ".join(f"P{r['prefill_tokens']}/B{r['decode_count']} {r['err_pct']:+.1f}" for r in rows))


def register(app: typer.Typer) -> None:
    """Add the `hardware` and `calibrate` commands to the CLI app."""

    @app.command("hardware")
    def hardware(model: Model = None,
                 gpu: Gpu = None,
                 tp: Tp = 1,
                 roofline: bool = typer.Option(False, "--roofline", help="uncalibrated roofline only"),
                 mode: str = typer.Option("physical", "--mode", help="physical or vidur_parity")) -> None:
        """List known models/GPUs, or show KV capacity and predicted times for one configuration."""
        console = Console()
        try:
            if model is None and gpu is None:
                _list_known(console)
                return
            _describe(console, model or "Llama-3-8B", gpu or "A100-80GB", tp, not roofline, mode)
        except TierserveError as e:
            console.print(f"[red]error:[/] {e}")
            raise typer.Exit(2) from None

    @app.command("calibrate")
    def calibrate(profiles: Optional[Path] = typer.Option(None, "--profiles", help="Vidur-format profiling/ folder"),
                  iterations: Optional[Path] = typer.Option(None, "--iterations", help="CSV of measured iterations"),
                  out: Path = typer.Option(..., "--out", help="where to write the fitted JSON"),
                  model: Model = None,
                  gpu: Gpu = None,
                  tp: Tp = None,
                  objective: str = typer.Option("relative", "--objective",
                                                help="linear iteration fit: relative (best per-step error) or mean "
                                                     "(plain least squares, right on the mean step: for simulation "
                                                     "from skewed step times)")) -> None:
        """Fit execution-time coefficients from Vidur profiles or from a measured-iteration log (--model, --gpu
        and --tp: those of the iteration log, for the physical fit)."""
        import json
        from dataclasses import asdict

        from tierserve.core.files import atomic_path, check_out_file, write_text_atomic
        from tierserve.hardware.calibration import PhysicalIterationFit, calibrate_from_iterations, fit_profile_tree
        console = Console()
        if (profiles is None) == (iterations is None):
            console.print("[red]error:[/] give exactly one of --profiles DIR or --iterations FILE")
            raise typer.Exit(2)
        try:
            check_out_file(out)                       # before the fit, so a long fit is never lost
            if profiles is not None:
                store, reports = fit_profile_tree(profiles)
                t = Table(title="Held-out fit error (MAPE %)")
                t.add_column("operator")
                t.add_column("MAPE %", justify="right")
                for k, v in store.meta["fit_error_pct"]["per_operator"].items():
                    t.add_row(k, f"{v:.2f}")
                for k, v in store.meta["fit_error_pct"]["per_model_gpu"].items():
                    t.add_row(k, f"{v:.2f}")
                console.print(t)
                with atomic_path(out) as tmp:
                    store.save(tmp)
            else:
                fit = calibrate_from_iterations(iterations, model, gpu, tp, objective)
                write_text_atomic(out, json.dumps(asdict(fit), indent=1) + "\n")
                if isinstance(fit, PhysicalIterationFit):
                    _print_physical_fit(console, fit)
                else:
                    console.print(f"fitted {fit.n_rows} iterations (linear model); held-out MAPE {fit.mape_test:.2f}%")
                _print_step_ratios(console, fit.step_time_ratios)
        except TierserveError as e:
            console.print(f"[red]error:[/] {e}")
            raise typer.Exit(2) from None
        console.print(f"wrote {out}")
