"""Run many independent simulations: serially, on a local process pool, or on a Ray cluster.

Interrupts: Ctrl-C (SIGINT) or SIGTERM stops `run_many` at once on every executor. Queued jobs are cancelled,
pool workers are terminated (they ignore SIGINT themselves, so only this process decides, and they die with
it even if it is killed outright), and `Interrupted` is raised with the results of the jobs that had finished.
A job that fails stops the others the same way, then its error is raised.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, Callable, Sequence

from tierserve.core import ConfigError
from tierserve.core.errors import Interrupted

EXECUTORS = ("serial", "process", "ray")
_received: list[str] = []          # the name of the last signal turned into KeyboardInterrupt


def _raise_interrupt(signum: int, frame: Any) -> None:
    _received.append(signal.Signals(signum).name)
    raise KeyboardInterrupt


def last_signal() -> str:
    """SIGTERM when the last KeyboardInterrupt came from SIGTERM (see `interrupt_on_sigterm`), else SIGINT."""
    return _received[-1] if _received else "SIGINT"


@contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt (as Ctrl-C does), so the same clean-up runs; only in
    the main thread, and only where nobody else has installed a SIGTERM handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _worker_init(parent_pid: int) -> None:
    """Pool workers leave interrupts to the parent, obey SIGTERM at once, and die with the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:                                      # Linux: SIGKILL this worker when its parent dies, however it dies
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:            # the parent died before prctl took effect
        os._exit(1)


def run_many(fn: Callable[..., Any], jobs: Sequence[dict[str, Any]], executor: str = "process",
             workers: int | None = None, progress: bool = True, description: str = "runs", *,
             on_result: Callable[[int, Any], None] | None = None, address: str | None = None) -> list[Any]:
    """`[fn(**job) for job in jobs]`, in order, on the chosen executor. `fn` must be importable (top level).

    `on_result(i, result)` is called in this process as each job ends (in the order they end), e.g. to keep
    finished work on disk. `address`: the Ray cluster to join (default: $RAY_ADDRESS, else a local Ray).
    Raises `Interrupted` (a KeyboardInterrupt) on Ctrl-C or SIGTERM, holding the finished jobs' results."""
    if executor not in EXECUTORS:
        raise ConfigError("executor", executor, ", ".join(EXECUTORS))
    if not jobs:
        return []
    results: list[Any] = [None] * len(jobs)
    finished = _Finished(on_result)
    with interrupt_on_sigterm():
        try:
            if executor == "ray":
                _ray(fn, jobs, progress, description, results, finished, address)
            elif executor == "serial" or len(jobs) == 1:
                _serial(fn, jobs, progress, description, results, finished)
            else:
                _pool(fn, jobs, workers, progress, description, results, finished)
        except Interrupted:
            raise
        except KeyboardInterrupt:
            raise Interrupted(last_signal(), description, results, sorted(finished)) from None
    return results


class _Finished(list):
    """Indices of the finished jobs; `add` also hands the result to the caller's `on_result`."""

    def __init__(self, on_result: Callable[[int, Any], None] | None) -> None:
        super().__init__()
        self.on_result = on_result

    def add(self, i: int, result: Any) -> None:
        self.append(i)
        if self.on_result is not None:
            self.on_result(i, result)


def _serial(fn, jobs, progress, description, results, finished) -> None:
    with _progress(progress, description, len(jobs)) as advance:
        for i, job in enumerate(jobs):
            results[i] = fn(**job)
            finished.add(i, results[i])
            advance()


def _pool(fn, jobs, workers, progress, description, results, finished) -> None:
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_init, initargs=(os.getpid(),))
    futures: dict[Future, int] = {}
    try:
        with _progress(progress, description, len(jobs)) as advance:
            futures = {pool.submit(fn, **job): i for i, job in enumerate(jobs)}
            pending = set(futures)
            while pending:
                # a short timeout keeps the main thread responsive to signals on every platform
                done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                for fut in done:
                    results[futures[fut]] = fut.result()
                    finished.add(futures[fut], results[futures[fut]])
                    advance()
    except BaseException:
        _stop_pool(pool, futures)
        raise
    pool.shutdown(wait=True)


def _stop_pool(pool: ProcessPoolExecutor, futures: dict[Future, int]) -> None:
    """Cancel what is queued and terminate the workers now (not after the running jobs end).

    Queued futures are cancelled by the pool's own manager thread (shutdown with cancel_futures): cancelling
    them from here races with that thread marking them broken once the workers die (CPython 3.11 then prints
    an InvalidStateError traceback)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 1.0
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=0.5)


def _ray(fn, jobs, progress, description, results, finished, address: str | None = None) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("executor", "ray", "install the extra: pip install 'tierserve[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(fn)
    refs = [remote.remote(**job) for job in jobs]
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    try:
        with _progress(progress, description, len(jobs)) as advance:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                results[index[done[0]]] = ray.get(done[0])
                finished.add(index[done[0]], results[index[done[0]]])
                advance()
    except BaseException:
        for ref in pending:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # a ref that already finished or whose worker is gone
                pass
        raise


class _progress:
    """A rich progress bar when asked for (and on a terminal), else a no-op counter."""

    def __init__(self, enabled: bool, description: str, total: int) -> None:
        self.enabled, self.description, self.total = enabled, description, total
        self._bar = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), transient=True)
            self._bar.start()
            task = self._bar.add_task(self.description, total=self.total)
            return lambda: self._bar.advance(task)
        return lambda: None

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
