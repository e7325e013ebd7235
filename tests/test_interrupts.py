"""Ctrl-C and SIGTERM stop runs at once: queued work cancelled, pool workers gone, nothing half-written that
looks whole, and a report of what finished."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tierserve.core.errors import Interrupted
from tierserve.experiments.runs import run_many


@pytest.fixture(autouse=True)
def default_signal_dispositions():
    """Run each test with Python's default SIGINT/SIGTERM handling: an earlier test in the same pytest process
    may leave SIGINT ignored, and an ignored SIGINT is inherited by the commands these tests start (which then,
    rightly, keep ignoring it)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def _session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes in session `sid`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            out.append(int(d.name))
    return out


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _start_compare(out: Path) -> subprocess.Popen:
    """`tierserve compare` of three stacks on a two-worker pool, each run long enough to be interrupted."""
    cmd = [sys.executable, "-c", "from tierserve.cli import main; main()", "compare",
           "--stacks", "vllm+round_robin,sarathi+round_robin,vllm_priority+jsq", "-n", "200000",
           "--replicas", "2", "--executor", "process", "--out", str(out)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def _wait_for_workers(proc: subprocess.Popen, n: int = 2, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(_children(proc.pid)) >= n:
            time.sleep(1.0)          # the workers are inside their simulations now
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    pytest.fail("the pool never started its workers")


def _no_file_claims_completeness_falsely(out: Path) -> None:
    for summary in out.rglob("summary.json"):
        doc = json.loads(summary.read_text())
        assert doc.get("complete") is True
        rows = (summary.parent / "requests.csv").read_text().count("\n")
        assert rows == 200001, f"{summary} says complete but requests.csv has {rows - 1} requests"
    for f in out.rglob("*"):
        if f.is_file():
            assert f.name in ("requests.csv", "summary.json", "summary_by_tier.csv", "manifest.json"), \
                f"left behind: {f}"
    top = out / "manifest.json"          # the finished stacks are published; the run as a whole is not complete
    assert not top.exists() or json.loads(top.read_text())["complete"] is False


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_compare_stops_it_within_2s_and_leaves_no_worker(tmp_path, sig, code):
    out = tmp_path / "out"
    proc = _start_compare(out)
    try:
        _wait_for_workers(proc)
        workers = _children(proc.pid)
        t0 = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)     # Ctrl-C: the terminal signals the whole foreground group
        else:
            proc.send_signal(sig)        # SIGTERM: to the command alone, as `kill` or a job scheduler does
        _, err = proc.communicate(timeout=10)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert elapsed < 2.0, f"took {elapsed:.2f} s to stop"
    assert proc.returncode == code, err
    assert "interrupted" in err and signal.Signals(sig).name in err and "of 3 stacks had finished" in err
    assert "Traceback" not in err
    time.sleep(0.2)
    assert not [w for w in workers if Path(f"/proc/{w}").exists() and w in _session_processes(proc.pid)]
    assert _session_processes(proc.pid) == []
    _no_file_claims_completeness_falsely(out)


def _assert_no_live_children() -> None:
    """No child process of this test is alive: each has exited (the pool's manager thread may still be reaping
    one that has just died, so give it a moment)."""
    import multiprocessing
    deadline = time.monotonic() + 2.0
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert multiprocessing.active_children() == []
    assert _children(os.getpid()) == []


def _sleepy(i: int, s: float) -> int:
    time.sleep(s)
    return i


def test_run_many_reports_finished_jobs_and_cancels_the_rest():
    """SIGINT arriving while jobs run: the finished job's result is kept, queued ones never start."""
    import threading

    def interrupt_soon():
        time.sleep(1.5)
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=interrupt_soon)
    t.start()
    t0 = time.monotonic()
    with pytest.raises(Interrupted) as ei:
        run_many(_sleepy, [{"i": 0, "s": 0.1}] + [{"i": i, "s": 30.0} for i in range(1, 6)], executor="process",
                 workers=2, progress=False, description="jobs")
    t.join()
    assert time.monotonic() - t0 < 4.0
    e = ei.value
    assert e.finished == [0] and e.results[0] == 0 and e.results[1:] == [None] * 5
    assert e.signal_name == "SIGINT" and "1 of 6 jobs finished" in str(e)
    _assert_no_live_children()


def _fails(i: int) -> int:
    if i == 0:
        raise ValueError("job 0 is broken")
    time.sleep(30)
    return i


def test_a_failing_job_stops_the_pool_instead_of_waiting_for_the_rest():
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="job 0 is broken"):
        run_many(_fails, [{"i": i} for i in range(4)], executor="process", workers=2, progress=False)
    assert time.monotonic() - t0 < 10.0
    _assert_no_live_children()


def test_serial_runs_report_what_finished_on_interrupt(monkeypatch):
    calls = []

    def job(i: int) -> int:
        calls.append(i)
        if i == 1:
            raise KeyboardInterrupt
        return i

    with pytest.raises(Interrupted) as ei:
        run_many(job, [{"i": i} for i in range(3)], executor="serial", progress=False)
    assert calls == [0, 1] and ei.value.finished == [0] and ei.value.results == [0, None, None]


def test_interrupted_write_leaves_no_file_under_the_final_name(tmp_path):
    from tierserve.core.files import atomic_path
    target = tmp_path / "requests.csv"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_text("arrival_s,prompt\n0,1\n")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_sigterm_to_a_single_simulate_stops_it_and_writes_nothing(tmp_path):
    """... and removes nothing it did not write: unrelated `*.partial` files in --out survive."""
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    theirs = {out / "notes.partial": "a", out / "sub" / "y.partial": "b", out / ".z.partial": "c"}
    for p, text in theirs.items():
        p.write_text(text)
    cmd = [sys.executable, "-c", "from tierserve.cli import main; main()", "simulate", "-n", "2000000",
           "--replicas", "1", "--rate", "50", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        time.sleep(3.0)
        assert proc.poll() is None, proc.communicate()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert elapsed < 2.0 and proc.returncode == 143, err
    assert "interrupted" in err and "SIGTERM" in err and "Traceback" not in err
    assert sorted(p for p in out.rglob("*") if p.is_file()) == sorted(theirs)    # nothing written, nothing lost
    assert all(p.read_text() == text for p, text in theirs.items())
