"""Run many independent simulations: serially, on a local process pool, or on a Ray cluster."""
from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable, Sequence

from tierserve.core import ConfigError

EXECUTORS = ("serial", "process", "ray")


def run_many(fn: Callable[..., Any], jobs: Sequence[dict[str, Any]], executor: str = "process",
             workers: int | None = None, progress: bool = True, description: str = "runs") -> list[Any]:
    """`[fn(**job) for job in jobs]`, in order, on the chosen executor. `fn` must be importable (top level)."""
    if executor not in EXECUTORS:
        raise ConfigError("executor", executor, ", ".join(EXECUTORS))
    if not jobs:
        return []
    if executor == "serial" or len(jobs) == 1:
        return _serial(fn, jobs, progress, description)
    if executor == "ray":
        return _ray(fn, jobs, progress, description)
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    results: list[Any] = [None] * len(jobs)
    with ProcessPoolExecutor(max_workers=workers) as pool, _progress(progress, description, len(jobs)) as advance:
        futures = {pool.submit(fn, **job): i for i, job in enumerate(jobs)}
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()
            advance()
    return results


def _serial(fn, jobs, progress, description):
    out = []
    with _progress(progress, description, len(jobs)) as advance:
        for job in jobs:
            out.append(fn(**job))
            advance()
    return out


def _ray(fn, jobs, progress, description):
    try:
        import ray
    except ImportError:
        raise ConfigError("executor", "ray", "install the extra: pip install 'tierserve[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(fn)
    refs = [remote.remote(**job) for job in jobs]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(jobs)
    pending = list(refs)
    with _progress(progress, description, len(jobs)) as advance:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            results[index[done[0]]] = ray.get(done[0])
            advance()
    return results


class _progress:
    """A rich progress bar when asked for (and on a terminal), else a no-op counter."""

    def __init__(self, enabled: bool, description: str, total: int) -> None:
        self.enabled, self.description, self.total = enabled, description, total
        self._bar = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import Progress
            self._bar = Progress(transient=True)
            self._bar.start()
            task = self._bar.add_task(self.description, total=self.total)
            return lambda: self._bar.advance(task)
        return lambda: None

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
