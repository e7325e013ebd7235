"""Simulator speed and memory: tierserve against Vidur on Vidur's own reference scenarios, and per-stack scaling.

    python benchmarks/sim_speed.py [--repeats 3] [--sizes 1000,10000,50000] [--no-scaling]
                                   [--scale-sizes 10000,50000] [--big] [--replicas-sweep] [--stacks a,b]
                                   [--million-64]
    python benchmarks/sim_speed.py --scale [--scale-n 100000,1000000,10000000] [--scale-records parquet]

What is timed. Every tierserve run is a fresh `python` process, timed **whole** from the parent — interpreter
start, imports, reading the requests, the event loop and writing `requests.csv` + `summary.json` +
`summary_by_tier.csv` — and its CPU seconds (user + sys) and peak RSS come from `wait4`. The child also
reports its event loop alone (`simulate()`), printed beside it, never mixed into a ratio.

Vidur comparison (section 1). Scenario = Vidur's reference runs (`../shared/data/vidur/reference_runs/*`:
Llama-3-8B, A100, TP1, one replica, Poisson 4 req/s, splitwise_conv lengths ≤ 4,096 tokens; Vidur `vllm` →
tierserve `vllm_v0`, token budget 4,096; `sarathi` chunk 512; batch cap 128, KV block 16, watermark 1%; the
execution model in `vidur_parity` mode), with the **same requests** (`read_vidur_run`).
  * With `VIDUR_PYTHON` (a Python with Vidur importable) and `VIDUR_DIR` (its checkout, run as cwd), Vidur
    runs the scenario built from each reference run's `config.json` (scheduler, seed, qps, trace, caps and
    metric settings), A B A B interleaved with tierserve, `--repeats` times; both sides are whole processes
    timed the same way and the ratios are of medians of CPU seconds (user + sys). Sizes without a reference
    run (50k) replay the requests Vidur itself drew in that run (its `request_metrics.csv` + arrival series),
    so both sides simulate the same requests. Vidur's predictor tables must already be in its cache
    (`VIDUR_CACHE_DIR`, default `VIDUR_DIR/cache`): training is not simulation and is refused, not timed.
    `VIDUR_DIR/VIDUR_COMMIT` names the commit (printed). Example (Vidur at 50k takes minutes per run):
        VIDUR_PYTHON=/work/vidur-venv/bin/python VIDUR_DIR=/work/vidur \
            nice -n 19 python benchmarks/sim_speed.py --sizes 50000 --repeats 2 --no-scaling
  * Without them, Vidur's **recorded** figures are printed, labelled as such: `summary.csv` (whole-process
    `wall_s`, `peak_rss_mb`) for 1k/10k and the reference README's 50k range. Those were measured on another
    day on a loaded machine (the README says not to divide by them), so the ratios are indicative only. The
    50k tierserve run then replays the 10k reference requests five times, shifted in time (same
    distribution and rate; not Vidur's 50k draw).

Scaling (section 2): every registered cluster policy with a local policy it is meant for (llumnix* with
`llumlet`), Poisson 4 req/s per replica (the reference load), 3 tiers, `azure2023_conv` lengths; seconds per
request and µs per event at each size (10k and 50k by default; `--big` adds 1M) and each replica count
(`--replicas-sweep`: 1…64 at 10k requests per replica, 64 opt-in with `--big`). The check: CPU time per
request of the event loop at the largest size within 1.5× of 10k, per stack. `--million-64` adds 1M requests
of each stack on 64 replicas, checked against 120 CPU-s for the whole process (requests built in the child). Cluster policies that need parameters (e.g. `silo`) are listed and skipped.

Memory at scale (section 3, `--scale`): one stack (vllm + round_robin, 16 replicas, Poisson 4 req/s per
replica, 3 tiers, `azure2023_conv` fitted lengths) run **streamed** (`run_scenario(..., stream=True)`: requests
generated as they arrive, records written to disk as requests end, statistics from streaming estimators) at
100k, 1M and 10M requests (`--scale-n`), each a fresh process: peak RSS, wall and seconds per request. The
checks: peak RSS at the largest size within 2x of 1M, and CPU seconds per request (user + sys of the whole
process, imports included; wall is printed too but on a shared machine it measures the neighbours) within 1.5x of
the smallest size.

The machine is shared: timings are noisy. Read medians of interleaved repeats, and the event counts (exact).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
# argparse, csv, statistics, subprocess and tempfile are imported where used: a measured child (whole process)
# must not pay for the parent's tools.

HERE = Path(__file__).resolve()
SCENARIOS = {"vllm": ("vllm_v0", 4096), "sarathi": ("sarathi", 512)}
# Vidur's README (reference_runs/README.md, "Timing"): 50k requests, whole process, on a loaded 2-core machine.
VIDUR_RECORDED_50K = {"wall_s": (213.0, 233.0), "peak_rss_mb": (2200.0, 2300.0)}
# Vidur's metric settings in the reference runs' config.json that differ from Vidur's CLI defaults.
VIDUR_METRICS_FLAGS = ["--no-metrics_config_enable_chrome_trace", "--no-metrics_config_store_plots",
                       "--metrics_config_store_token_completion_metrics"]
VIDUR_NUM_PREDICTION_TABLES = 12   # Vidur's random-forest predictor caches 12 dense tables (Llama-3-8B, TP1, PP1)
VIDUR_INFO_FILE = "VIDUR_COMMIT"   # in VIDUR_DIR: first line the commit, then how the tree and its cache were made
SCALING_STACKS = [("vllm", "round_robin"), ("vllm", "random"), ("vllm", "jsq"), ("vllm", "infaas"),
                  ("vllm_v0", "round_robin"), ("sarathi", "round_robin"), ("llumlet", "llumnix"),
                  ("llumlet", "llumnix_k"), ("llumlet", "llumnix_k_adaptive"), ("niyama", "deadline_slack")]
DEADLINE_STACKS = {"deadline_slack"}     # run with Niyama's QoS-class SLOs (deadlines to order by)


def reference_dir(kind: str, n: int) -> Path | None:
    from tierserve.core.paths import shared_data
    d = shared_data() / "vidur" / "reference_runs" / f"l3_{kind}_poisson_qps4_n{n}"
    return d if d.is_dir() else None


# ----- children: one run each, in a fresh process -----
def child_vidur_scenario(kind: str, n: int, requests_dir: str, outdir: str) -> dict:
    t_import = time.perf_counter()
    from tierserve.metrics import RequestTable, TokenTBT, summarize
    from tierserve.metrics.io import write_outputs
    from tierserve.core import TierSet
    from tierserve.sim import ClusterConfig, simulate
    from tierserve.workload import read_vidur_run
    t0 = time.perf_counter()
    requests = read_vidur_run(requests_dir)
    if len(requests) < n:           # no reference run of this size: the requests repeated, shifted in time
        from itertools import cycle
        from tierserve.core import Request
        from tierserve.core.gc_tuning import collect_less_often
        span = requests[-1].arrival_s + 1.0 / 4.0
        m = len(requests)
        with collect_less_often():  # as the trace readers build theirs: all kept, no cycles
            requests = requests + [Request(i, r.arrival_s + span * (i // m), r.prompt_tokens, r.output_tokens)
                                   for i, r in zip(range(m, n), cycle(requests))]   # the first m as read
    local, budget = SCENARIOS[kind]
    cfg = ClusterConfig(num_replicas=1, local_policy=local, cluster_policy="round_robin",
                        replica={"model": "Llama-3-8B", "gpu": "A100-80GB", "tp": 1, "exec_mode": "vidur_parity",
                                 "token_budget": budget, "max_num_seqs": 128, "block_size": 16,
                                 "watermark_fraction": 0.01, "gpu_memory_utilization": 0.9})
    t1 = time.perf_counter()
    sim = simulate(cfg, requests)
    t2 = time.perf_counter()
    table = RequestTable.from_states(sim.states, sim.reasons)
    summary = summarize(table, TokenTBT.from_histograms(sim.tbt_by_tier), sim.duration_s, TierSet.default(1),
                        {k: v for k, v in sim.stats.items() if k != "wall_s"})
    write_outputs(outdir, table, summary, cfg.model_dump(mode="json"))
    t3 = time.perf_counter()
    return {"n": len(requests), "events": sim.stats["events"], "loop_s": t2 - t1, "read_s": t1 - t0,
            "import_s": t0 - t_import, "write_s": t3 - t2}


def child_stack(local: str, cluster: str, n: int, replicas: int) -> dict:
    from tierserve.sim import ClusterConfig, simulate
    from tierserve.workload import WorkloadConfig, build_requests
    wl = WorkloadConfig.from_dict({
        "num_requests": n, "seed": 42, "arrivals": {"kind": "poisson", "rate": 4.0 * replicas},
        "lengths": {"kind": "empirical", "dataset": "azure2023_conv", "max_total_tokens": 4096},
        "tiers": {"num_tiers": 3, "mix": "uniform", **({"preset": "niyama"} if cluster in DEADLINE_STACKS else {})}})
    requests = build_requests(wl)
    cfg = ClusterConfig(num_replicas=replicas, local_policy=local, cluster_policy=cluster,
                        cluster_policy_params={"num_tiers": 3} if cluster.startswith("llumnix") else {})
    t0 = time.perf_counter()
    c0 = time.process_time()
    res = simulate(cfg, requests, 3)
    return {"n": n, "events": res.stats["events"], "loop_s": time.perf_counter() - t0,
            "loop_cpu_s": time.process_time() - c0}


def child_scale(n: int, replicas: int, outdir: str, records: str) -> dict:
    from tierserve.experiments.scenario import ScenarioConfig, run_scenario, write_result
    cfg = ScenarioConfig.from_dict({
        "seed": 42, "cluster": {"num_replicas": replicas, "local_policy": "vllm", "cluster_policy": "round_robin"},
        "workload": {"num_requests": n, "arrivals": {"kind": "poisson", "rate": 4.0 * replicas},
                     "lengths": {"kind": "fit", "dataset": "azure2023_conv", "max_total_tokens": 4096},
                     "tiers": {"num_tiers": 3, "mix": "uniform"}}})
    t0 = time.perf_counter()
    res = run_scenario(cfg, stream=True, outdir=outdir, records=records)
    write_result(res, outdir)
    size = sum(p.stat().st_size for p in Path(outdir).iterdir())
    return {"n": n, "events": res.sim.stats["events"], "loop_s": res.sim.stats["wall_s"],
            "run_s": time.perf_counter() - t0, "finished": res.summary.all.finished,
            "total": res.summary.all.total, "out_mb": size / 2**20}


def scale(sizes: list[int], replicas: int, records: str) -> bool:
    print(f"\n3. Memory at scale, streamed (vllm+round_robin, {replicas} replicas, Poisson 4 req/s per replica, "
          f"3 tiers, azure2023_conv lengths; records: {records}; whole process)")
    print(f"   {'requests':>10} {'peak RSS MB':>11} {'wall s':>9} {'cpu s':>9} {'cpu us/req':>10} {'events':>10} "
          f"{'cpu us/ev':>9} {'accounted':>10} {'files MB':>9}")
    import tempfile
    rows = {}
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            r = run_child(["scale", str(n), str(replicas), tmp, records])
        rows[n] = r
        print(f"   {n:>10,} {r['peak_rss_mb']:>11.0f} {r['wall_s']:>9.1f} {r['cpu_s']:>9.1f} "
              f"{1e6 * r['cpu_s'] / n:>10.1f} {r['events']:>10} {1e6 * r['cpu_s'] / r['events']:>9.1f} "
              f"{r['total'] == n!s:>10} {r['out_mb']:>9.1f}", flush=True)
    ok = all(r["total"] == n for n, r in rows.items())
    big = max(sizes)
    if 1_000_000 in rows and big > 1_000_000:
        ratio = rows[big]["peak_rss_mb"] / rows[1_000_000]["peak_rss_mb"]
        flat = ratio <= 2.0
        ok &= flat
        print(f"   peak RSS {big:,} vs 1,000,000: {ratio:.2f}x  {'OK (<= 2x)' if flat else 'FAIL (> 2x)'}")
    lo = min(sizes)
    if big > lo:
        t = (rows[big]["cpu_s"] / big) / (rows[lo]["cpu_s"] / lo)
        flat = t <= 1.5
        ok &= flat
        print(f"   CPU time per request {big:,} vs {lo:,}: {t:.2f}x  {'OK (<= 1.5x)' if flat else 'FAIL (> 1.5x)'}")
    return ok


def run_child(args: list[str]) -> dict:
    """Run this file as a child: whole-process wall from here; its CPU (user + sys since start, imports
    included) and peak RSS from its own getrusage at exit."""
    import subprocess
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(HERE), "--child", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{err}")
    rec = json.loads(out.strip().splitlines()[-1])
    rec["wall_s"] = wall
    rec["cpu_s"] = rec.pop("_cpu_s")
    rec["peak_rss_mb"] = rec.pop("_rss_mb")
    from tierserve import _native
    if rec.pop("_hot_path") != _native.REASON:       # a child must not measure another build than the header says
        raise RuntimeError(f"child {args} ran another hot path than this process: {_native.REASON}")
    return rec


def run_measured(cmd: list[str], cwd: str | None = None) -> dict:
    """Whole-process wall, CPU (user + sys) and peak RSS of any command."""
    import subprocess
    import tempfile
    with tempfile.TemporaryFile() as errf:   # a file, not a pipe: a full pipe would block the child during wait4
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=errf)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        errf.seek(0)
        err = errf.read().decode(errors="replace")
    if status != 0:
        raise RuntimeError(f"{cmd[:3]}… failed (status {status}):\n{err[-2000:]}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_rss_mb": ru.ru_maxrss / 1024}


# ----- Vidur -----
def vidur_command(py: str, config: dict, n: int, outdir: str, cache_dir: str) -> list[str]:
    """Vidur's CLI (microsoft/vidur@7d47513 flag names) reproducing a reference run's config.json: same seed,
    scheduler, caps, trace, qps and metric settings; `n` requests; the predictor read from `cache_dir`."""
    cl = config["cluster_config"]
    rep, sch = cl["replica_config"], cl["replica_scheduler_config"]
    gen = config["request_generator_config"]
    lg, ig = gen["length_generator_config"], gen["interval_generator_config"]
    pred = config["execution_time_predictor_config"]
    kind = sch["name"]
    cmd = [py, "-m", "vidur.main", "--seed", str(config["seed"]),
           "--replica_config_model_name", rep["model_name"], "--replica_config_device", rep["device"],
           "--replica_config_network_device", rep["network_device"],
           "--replica_config_tensor_parallel_size", str(rep["tensor_parallel_size"]),
           "--replica_config_num_pipeline_stages", str(rep["num_pipeline_stages"]),
           "--replica_config_memory_margin_fraction", str(rep["memory_margin_fraction"]),
           "--cluster_config_num_replicas", str(cl["num_replicas"]),
           "--global_scheduler_config_type", cl["global_scheduler_config"]["name"],
           "--replica_scheduler_config_type", kind,
           f"--{kind}_scheduler_config_batch_size_cap", str(sch["batch_size_cap"]),
           f"--{kind}_scheduler_config_block_size", str(sch["block_size"]),
           f"--{kind}_scheduler_config_watermark_blocks_fraction", str(sch["watermark_blocks_fraction"]),
           "--request_generator_config_type", gen["name"],
           "--synthetic_request_generator_config_num_requests", str(n),
           "--synthetic_request_generator_config_seed", str(gen["seed"]),
           "--length_generator_config_type", lg["name"],
           "--trace_request_length_generator_config_trace_file", lg["trace_file"],
           "--trace_request_length_generator_config_max_tokens", str(lg["max_tokens"]),
           "--trace_request_length_generator_config_seed", str(lg["seed"]),
           "--interval_generator_config_type", ig["name"],
           "--poisson_request_interval_generator_config_qps", str(ig["qps"]),
           "--poisson_request_interval_generator_config_seed", str(ig["seed"]),
           *VIDUR_METRICS_FLAGS,
           "--metrics_config_cache_dir", cache_dir,
           "--metrics_config_output_dir", outdir]
    if "chunk_size" in sch and kind == "sarathi":
        cmd += ["--sarathi_scheduler_config_chunk_size", str(sch["chunk_size"])]
    if "max_tokens_in_batch" in sch and sch["max_tokens_in_batch"]:
        cmd += [f"--{kind}_scheduler_config_max_tokens_in_batch", str(sch["max_tokens_in_batch"])]
    if pred.get("skip_cpu_overhead_modeling"):
        cmd += ["--random_forrest_execution_time_predictor_config_skip_cpu_overhead_modeling"]
    return cmd


def vidur_output_run(outdir: Path) -> Path | None:
    """A folder `read_vidur_run` can replay from Vidur's output: Vidur nests request_metrics.csv under a
    timestamp and writes the arrival series under plots/, so both are linked side by side in `replay/`."""
    hits = sorted(outdir.rglob("request_metrics.csv"))
    if not hits:
        return None
    run = hits[-1].parent
    arrivals = run / "plots" / "request_arrival_time_series.csv"
    if not arrivals.exists():
        return None
    replay = outdir / "replay"
    replay.mkdir(exist_ok=True)
    for src in (hits[-1], arrivals):
        (replay / src.name).symlink_to(src)
    return replay


def vidur_setup(py: str, vdir: str) -> dict:
    """Check a live Vidur before timing it: the checkout, its trace file, a warm predictor cache (a cold one
    would add Vidur's random-forest training to the first timed run) and the commit it was built from."""
    root = Path(vdir)
    if not (root / "vidur" / "main.py").is_file():
        raise SystemExit(f"VIDUR_DIR={vdir}: no vidur/main.py there (expected a microsoft/vidur checkout)")
    if not Path(py).is_file():
        raise SystemExit(f"VIDUR_PYTHON={py}: not a file")
    cfg = json.loads((reference_dir("vllm", 10000) / "config.json").read_text())
    trace = root / cfg["request_generator_config"]["length_generator_config"]["trace_file"]
    if not trace.is_file():
        raise SystemExit(f"VIDUR_DIR={vdir}: trace file {trace} (from the reference config.json) is missing")
    cache = Path(os.environ.get("VIDUR_CACHE_DIR", str(root / "cache")))
    tables = len(list(cache.glob("*_predictions.pkl"))) if cache.is_dir() else 0
    if tables < VIDUR_NUM_PREDICTION_TABLES:
        raise SystemExit(f"VIDUR_CACHE_DIR={cache}: {tables} predictor tables, need {VIDUR_NUM_PREDICTION_TABLES}; "
                         "run Vidur once on this scenario to train them (training is not simulation time)")
    info = (root / VIDUR_INFO_FILE).read_text().strip().splitlines() if (root / VIDUR_INFO_FILE).is_file() else []
    return {"cache_dir": str(cache), "commit": info[0] if info else "unknown (no VIDUR_COMMIT file)",
            "notes": info[1:]}


def vidur_recorded(kind: str, n: int) -> dict | None:
    import csv
    import statistics
    d = reference_dir(kind, 1000)
    if d is None:
        return None
    with open(d.parent / "summary.csv") as f:
        for row in csv.DictReader(f):
            if row["run"] == f"l3_{kind}_poisson_qps4_n{n}":
                return {"wall_s": float(row["wall_s"]), "peak_rss_mb": float(row["peak_rss_mb"]),
                        "loop_s": float(row["event_loop_s"]), "events": int(row["events_processed"])}
    if n == 50000:
        return {"wall_s": statistics.mean(VIDUR_RECORDED_50K["wall_s"]),
                "peak_rss_mb": statistics.mean(VIDUR_RECORDED_50K["peak_rss_mb"]), "loop_s": float("nan"),
                "events": None, "range": True}
    return None


def compare_with_vidur(sizes: list[int], repeats: int, kinds: list[str] | None = None) -> None:
    import statistics
    import tempfile
    py, vdir = os.environ.get("VIDUR_PYTHON"), os.environ.get("VIDUR_DIR")
    live = bool(py and vdir)
    print("1. tierserve vs Vidur, Vidur's reference scenarios, same requests; whole process (import, read, "
          "simulate, write outputs)")
    print(f"   Vidur: {'MEASURED NOW, side by side, interleaved A B A B (VIDUR_PYTHON/VIDUR_DIR)' if live else 'RECORDED figures (reference_runs/summary.csv, README), not side by side'}")
    setup = vidur_setup(py, vdir) if live else None
    if live:
        print(f"   Vidur commit: {setup['commit']}; run as `{py} -m vidur.main` in {vdir}")
        for note in setup["notes"]:
            print(f"     {note}")
        print(f"   Vidur settings: each reference run's config.json as CLI flags (seed 42, Llama-3-8B A100 TP1, "
              f"round_robin, Poisson 4 req/s, splitwise_conv_x3 lengths, caps as listed), metrics "
              f"{' '.join(VIDUR_METRICS_FLAGS)}; predictor tables loaded from {setup['cache_dir']}")
        print(f"   Process: both sides inherit this process's niceness ({os.nice(0)}); CPU = user + sys from wait4")
    if live:
        hdr = (f"{'scenario':>8} {'requests':>8} | {'ts wall s':>9} {'ts cpu s':>8} {'ts loop s':>9} {'ts MB':>6} "
               f"{'ev/req':>6} {'us/event':>8} | {'Vidur wall s':>12} {'Vidur cpu s':>11} {'Vidur MB':>8} | "
               f"{'req/cpu-s ts':>12} {'Vidur':>7} {'ratio':>7} {'MB ratio':>8}")
    else:
        hdr = (f"{'scenario':>8} {'requests':>8} | {'ts wall s':>9} {'ts cpu s':>8} {'ts loop s':>9} {'ts MB':>6} "
               f"{'ev/req':>6} {'us/event':>8} | {'Vidur wall s':>12} {'Vidur MB':>8} | {'req/s ratio':>11} "
               f"{'MB ratio':>8}")
    print(hdr)
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds or list(SCENARIOS):
            for n in sizes:
                ref = reference_dir(kind, n)
                ours, theirs = [], []
                req_dir = str(ref) if ref is not None else None
                for r in range(repeats):
                    if live:
                        base_cfg = json.loads(((ref or reference_dir(kind, 10000)) / "config.json").read_text())
                        vout = Path(tmp) / f"vidur_{kind}_{n}_{r}"
                        theirs.append(run_measured(vidur_command(py, base_cfg, n, str(vout), setup["cache_dir"]),
                                                   cwd=vdir))
                        if req_dir is None:      # replay exactly the requests Vidur drew
                            replay = vidur_output_run(vout)
                            if replay is None:
                                raise SystemExit(f"Vidur wrote no request_metrics.csv + arrival series under {vout}")
                            req_dir = str(replay)
                    src = req_dir or str(reference_dir(kind, 10000))
                    ours.append(run_child(["scenario", kind, str(n), src, str(Path(tmp) / f"ts_{kind}_{n}_{r}")]))
                med = {k: statistics.median(o[k] for o in ours) for k in ("wall_s", "cpu_s", "loop_s", "peak_rss_mb")}
                events = ours[0]["events"]
                ours_cols = (f"{kind:>8} {n:>8} | {med['wall_s']:>9.2f} {med['cpu_s']:>8.2f} {med['loop_s']:>9.2f} "
                             f"{med['peak_rss_mb']:>6.0f} {events / n:>6.2f} {1e6 * med['loop_s'] / events:>8.1f} | ")
                if live:
                    v = {k: statistics.median(t[k] for t in theirs) for k in ("wall_s", "cpu_s", "peak_rss_mb")}
                    ts_rate, v_rate = n / med["cpu_s"], n / v["cpu_s"]   # simulated requests per CPU-second
                    print(ours_cols + f"{v['wall_s']:>12.1f} {v['cpu_s']:>11.1f} {v['peak_rss_mb']:>8.0f} | "
                          f"{ts_rate:>12.0f} {v_rate:>7.0f} {ts_rate / v_rate:>6.1f}x "
                          f"{v['peak_rss_mb'] / med['peak_rss_mb']:>7.1f}x", flush=True)
                    ts_runs = ", ".join(f"{o['cpu_s']:.2f}" for o in ours)
                    v_runs = ", ".join(f"{t['cpu_s']:.1f}" for t in theirs)
                    print(f"{'':>8} {'':>8}   runs (cpu s, in order): tierserve {ts_runs}; Vidur {v_runs}", flush=True)
                    continue
                v = vidur_recorded(kind, n)
                if v is None:
                    print(f"{kind:>8} {n:>8} | no recorded Vidur figure for this size")
                    continue
                ratio_basis = v["wall_s"] / med["wall_s"]    # recorded wall (loaded machine) vs ours
                label = " (recorded" + (", README range mid" if v.get("range") else "") + ")"
                print(ours_cols + f"{v['wall_s']:>12.1f} {v['peak_rss_mb']:>8.0f} | {ratio_basis:>10.1f}x "
                      f"{v['peak_rss_mb'] / med['peak_rss_mb']:>7.1f}x{label}")
    if live:
        print("   ratio = tierserve / Vidur simulated requests per CPU-second (medians of the interleaved runs); "
              "MB ratio = Vidur peak RSS / ours. 'loop' = simulate() alone, not in any ratio.")
    else:
        print("   ratio = recorded Vidur wall / our median wall; MB ratio = Vidur peak RSS / ours. "
              "'loop' = simulate() alone.")
        print("   The 50k tierserve run replays the 10k reference requests 5x, shifted in time (not Vidur's 50k draw).")


def _stack_row(label: str, reps: int, n: int, r: dict) -> None:
    print(f"   {label:>30} {reps:>8} {n:>9} {r['wall_s']:>8.2f} {r['cpu_s']:>8.2f} {r['loop_cpu_s']:>8.2f} "
          f"{1e6 * r['loop_cpu_s'] / n:>8.1f} {r['events']:>9} {1e6 * r['loop_cpu_s'] / r['events']:>8.1f} "
          f"{r['peak_rss_mb']:>6.0f}", flush=True)


def scaling(stacks: list[tuple[str, str]], sizes: list[int], replica_counts: list[int],
            million_64: bool = False) -> bool:
    """Per stack: CPU per request at each size (1 replica) and replica count; the flatness check; and, with
    `million_64`, 1M requests of each stack on 64 replicas against the 2 CPU-minute target."""
    from tierserve.policies.cluster import CLUSTER_POLICIES
    names = {c for _, c in stacks}
    skipped = [c for c in CLUSTER_POLICIES.names if c not in names]
    print("\n2. Scaling per stack (Poisson 4 req/s per replica, 3 tiers, azure2023_conv lengths). 'cpu s' = whole "
          "process (user + sys: imports, building the requests, the loop); 'loop' = simulate() alone, CPU; "
          "us/req and us/event from the loop's CPU")
    if skipped:
        print(f"   registered but not run (need parameters or not listed): {', '.join(skipped)}")
    ok = True
    print(f"   {'stack':>30} {'replicas':>8} {'requests':>9} {'wall s':>8} {'cpu s':>8} {'loop s':>8} {'us/req':>8} "
          f"{'events':>9} {'us/event':>8} {'MB':>6}")
    for local, cluster in stacks:
        per_req = {}
        for n in sizes:
            r = run_child(["stack", local, cluster, str(n), "1"])
            per_req[n] = r["loop_cpu_s"] / n
            _stack_row(local + "+" + cluster, 1, n, r)
        for reps in replica_counts:
            n = 10000 * reps
            _stack_row(local + "+" + cluster, reps, n, run_child(["stack", local, cluster, str(n), str(reps)]))
        if len(sizes) > 1:
            lo, hi = min(sizes), max(sizes)
            ratio = per_req[hi] / per_req[lo]
            flat = ratio <= 1.5
            ok &= flat
            print(f"   {'':>30} CPU per request {hi:,} vs {lo:,}: {ratio:.2f}x  {'OK (<= 1.5x)' if flat else 'FAIL (> 1.5x)'}")
    if million_64:
        n, reps = 1_000_000, 64
        for local, cluster in stacks:
            r = run_child(["stack", local, cluster, str(n), str(reps)])
            _stack_row(local + "+" + cluster, reps, n, r)
            fast = r["cpu_s"] < 120.0
            ok &= fast
            print(f"   {'':>30} 1M requests on 64 replicas: {r['cpu_s']:.0f} CPU-s whole process  "
                  f"{'OK (< 120 s)' if fast else 'FAIL (>= 120 s)'}")
    return ok


def child_main(args: list[str]) -> int:
    """One measured run (`--child KIND ARGS...`): prints its record, with this process's CPU and peak RSS."""
    kind, *rest = args
    rec = (child_vidur_scenario(rest[0], int(rest[1]), rest[2], rest[3]) if kind == "scenario"
           else child_scale(int(rest[0]), int(rest[1]), rest[2], rest[3]) if kind == "scale"
           else child_stack(rest[0], rest[1], int(rest[2]), int(rest[3])))
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    rec["_cpu_s"] = ru.ru_utime + ru.ru_stime
    rec["_rss_mb"] = ru.ru_maxrss / 1024
    from tierserve import _native
    rec["_hot_path"] = _native.REASON
    print(json.dumps(rec))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--child"]:       # before argparse: the child's measured CPU should not include it
        return child_main(argv[1:])
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,50000", help="Vidur-scenario sizes")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs per Vidur-scenario size")
    ap.add_argument("--no-vidur", action="store_true", help="skip section 1")
    ap.add_argument("--vidur-scenarios", default=",".join(SCENARIOS), help="section 1 scenarios: vllm,sarathi")
    ap.add_argument("--no-scaling", action="store_true", help="skip section 2")
    ap.add_argument("--scale-sizes", default="10000,50000", help="requests per stack (1 replica)")
    ap.add_argument("--big", action="store_true", help="add 1M requests and 64 replicas (long)")
    ap.add_argument("--replicas-sweep", action="store_true", help="1…32 replicas at 10k requests per replica")
    ap.add_argument("--million-64", action="store_true",
                    help="also 1M requests of each stack (--stacks) on 64 replicas (target: < 120 CPU-s, whole "
                         "process; ~1-2 minutes a stack)")
    ap.add_argument("--stacks", default=None, help="local+cluster,… (default: every registered cluster policy)")
    ap.add_argument("--scale", action="store_true", help="section 3 only: peak RSS and time per request, streamed")
    ap.add_argument("--scale-n", default="100000,1000000,10000000", help="requests per --scale run")
    ap.add_argument("--scale-replicas", type=int, default=16)
    ap.add_argument("--scale-records", default="parquet", help="csv | parquet (parquet needs pyarrow)")
    args = ap.parse_args(argv)
    from tierserve import _native
    print(f"tierserve's hot path in these runs: {_native.REASON} (tierserve/_native.py; every child checks it is the same)")
    if args.scale:
        return 0 if scale([int(x) for x in args.scale_n.split(",")], args.scale_replicas, args.scale_records) else 1
    if not args.no_vidur:
        kinds = args.vidur_scenarios.split(",")
        if any(k not in SCENARIOS for k in kinds):
            ap.error(f"--vidur-scenarios {args.vidur_scenarios!r}: each must be one of {list(SCENARIOS)}")
        compare_with_vidur([int(s) for s in args.sizes.split(",")], args.repeats, kinds)
    if args.no_scaling:
        return 0
    stacks = ([tuple(s.split("+")) for s in args.stacks.split(",")] if args.stacks else SCALING_STACKS)
    sizes = [int(s) for s in args.scale_sizes.split(",")] + ([1_000_000] if args.big else [])
    reps = ([1, 2, 4, 8, 16, 32] + ([64] if args.big else [])) if args.replicas_sweep else ([64] if args.big else [])
    return 0 if scaling(stacks, sizes, reps, args.million_64) else 1


if __name__ == "__main__":
    sys.exit(main())
