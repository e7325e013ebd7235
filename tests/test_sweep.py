"""Sweeps give the same results, in job order, on every executor; sweep specs run resumably."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tierserve.core import ConfigError
from tierserve.core.outputs import sha256_of
from tierserve.experiments.sweep import Sweep, finished_points, read_table, run_many, run_sweep

# json.dumps is importable in any worker (a test module is not, on Ray) and takes its argument by keyword.
JOBS = [{"obj": [i, i * i]} for i in range(6)]
EXPECTED = [json.dumps([i, i * i]) for i in range(6)]


def small_spec(num_requests: int = 200, rates=(4.0, 8.0), seeds=(0, 1)) -> dict:
    return {"name": "t", "seeds": list(seeds),
            "base": {"cluster": {"num_replicas": 2},
                     "workload": {"num_requests": num_requests, "arrivals": {"kind": "poisson", "rate": 5.0}}},
            "params": {"stack": ["vllm+round_robin", "vllm_priority+round_robin"], "rate": list(rates)}}


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray with 2 CPUs for the module's Ray tests (its start-up is their main cost)."""
    ray = pytest.importorskip("ray", reason="ray not installed (pip install 'tierserve[dev]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    yield ray
    ray.shutdown()


@pytest.mark.parametrize("executor", ["serial", "process"])
def test_run_many_keeps_job_order(executor):
    assert run_many(json.dumps, JOBS, executor=executor, workers=2, progress=False) == EXPECTED


def test_run_many_on_local_ray(local_ray):
    assert run_many(json.dumps, JOBS, executor="ray", progress=False) == EXPECTED


def test_unknown_executor_is_named():
    with pytest.raises(ConfigError, match="executor"):
        run_many(json.dumps, JOBS, executor="slurm")


def test_on_result_sees_every_job_as_it_ends():
    seen: list[tuple[int, str]] = []
    run_many(json.dumps, JOBS, executor="process", workers=2, progress=False, on_result=lambda i, r: seen.append((i, r)))
    assert sorted(seen) == list(enumerate(EXPECTED))


def test_spec_is_the_cross_product_with_full_configs():
    sweep = Sweep.from_dict(small_spec())
    assert len(sweep.points) == 2 * 2 * 2
    assert len({p.id for p in sweep.points}) == 8
    p = sweep.points[-1]
    assert p.params == {"stack": "vllm_priority+round_robin", "rate": 8.0} and p.seed == 1
    assert p.config["cluster"]["local_policy"] == "vllm_priority"
    assert p.config["workload"]["arrivals"]["rate"] == 8.0 and p.config["seed"] == 1


@pytest.mark.parametrize("params, field", [({"replicas": [0]}, "num_replicas"), ({"stack": ["vllm"]}, "stack"),
                                           ({"colour": [1]}, "params.colour"), ({"rho": [0.5]}, "params.rho"),
                                           ({"rate": []}, "params.rate")])
def test_bad_spec_names_the_field(params, field):
    spec = {**small_spec(), "params": params}
    with pytest.raises(ConfigError, match=field):
        Sweep.from_dict(spec)


def test_killed_sweep_resumes_running_only_missing_points(tmp_path):
    spec_path = tmp_path / "spec.yaml"
    import yaml
    spec_path.write_text(yaml.safe_dump(small_spec(num_requests=1000, rates=(3.0, 5.0))))
    out = tmp_path / "out"
    sweep = Sweep.from_yaml(spec_path)
    total = len(sweep.points)
    proc = subprocess.Popen([sys.executable, "-m", "tierserve", "sweep", str(spec_path), "--out", str(out),
                             "--executor", "serial"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(finished_points(sweep, out) if out.exists() else ()) < 2:
            assert proc.poll() is None, "the sweep ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    kept = {p.id: (out / "points" / f"{p.id}.json").stat().st_mtime_ns for p in sweep.points
            if (out / "points" / f"{p.id}.json").is_file()}
    assert 2 <= len(kept) < total
    assert not (out / "manifest.json").exists()       # a killed sweep's folder does not look finished
    res = run_sweep(sweep, out, executor="serial", progress=False)
    assert (res.ran, res.reused) == (total - len(kept), len(kept))
    for pid, mtime in kept.items():                   # the points that had finished were not run again
        assert (out / "points" / f"{pid}.json").stat().st_mtime_ns == mtime
    rows = read_table(res.table_path)
    assert [r["point_id"] for r in rows] == [p.id for p in sweep.points]
    assert all(json.loads(r["config"])["seed"] == r["seed"] for r in rows)
    again = run_sweep(sweep, out, executor="serial", progress=False, table_format="csv")
    assert (again.ran, again.reused) == (0, total)
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["files"]) == {f"points/{p.id}.json" for p in sweep.points} | {"results.csv", "sweep.json"}
    assert not (out / "results.parquet").exists()     # the rerun's result replaced the previous one whole
    for rel, entry in manifest["files"].items():
        assert entry["sha256"] == sha256_of(out / rel)


def test_sweep_manifest_names_only_this_sweeps_points(tmp_path):
    first = Sweep.from_dict(small_spec(seeds=(0,), rates=(3.0,)))
    second = Sweep.from_dict(small_spec(seeds=(1,), rates=(3.0,)))
    out = tmp_path / "out"
    run_sweep(first, out, executor="serial", progress=False, table_format="csv")
    (out / "points" / "unrelated.json").write_text("{}")   # not the sweep's: left alone
    res = run_sweep(second, out, executor="serial", progress=False, table_format="csv")
    assert res.ran == len(second.points)
    kept = {q.name for q in (out / "points").iterdir()}
    assert kept == {f"{p.id}.json" for p in second.points} | {"unrelated.json"}
    assert [int(r["seed"]) for r in read_table(out / "results.csv")] == [1] * len(second.points)


def test_a_point_file_that_is_not_the_points_is_run_again(tmp_path):
    sweep = Sweep.from_dict(small_spec(seeds=(0,), rates=(3.0,)))
    out = tmp_path / "out"
    run_sweep(sweep, out, executor="serial", progress=False, table_format="csv")
    victim = out / "points" / f"{sweep.points[0].id}.json"
    victim.write_text('{"id": "%s", "config": {}, "metrics": {}}' % sweep.points[0].id)
    res = run_sweep(sweep, out, executor="serial", progress=False, table_format="csv")
    assert (res.ran, res.reused) == (1, len(sweep.points) - 1)
    assert json.loads(victim.read_text())["config"] == sweep.points[0].config


def test_a_second_sweep_on_a_busy_folder_is_refused(tmp_path):
    from tierserve.core.outputs import FolderLock
    sweep = Sweep.from_dict(small_spec(seeds=(0,), rates=(3.0,)))
    out = tmp_path / "out"
    out.mkdir()
    with FolderLock(out), pytest.raises(ConfigError, match="no other run is writing"):
        run_sweep(sweep, out, executor="serial", progress=False)
    assert not (out / "points").exists()


def _numbers(rows):
    return json.dumps([{k: v for k, v in r.items()} for r in rows], sort_keys=True, default=str)


def test_sweep_on_local_ray_gives_the_pool_numbers(tmp_path, local_ray):
    sweep = Sweep.from_dict(small_spec(seeds=(0,)))
    pool = run_sweep(sweep, tmp_path / "pool", executor="process", workers=2, progress=False)
    ray = run_sweep(sweep, tmp_path / "ray", executor="ray", progress=False)
    assert ray.ran == pool.ran == len(sweep.points)
    assert _numbers(read_table(ray.table_path)) == _numbers(read_table(pool.table_path))
    assert any(r["tier0.slo_attainment"] > 0 for r in ray.rows)
