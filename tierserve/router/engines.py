"""The engines behind the router: their /metrics read every `scrape_interval_s`, up/down state, models."""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tierserve.router.config import RouterConfig
from tierserve.router.view import EngineView, Scrape

log = logging.getLogger("tierserve.router")

DEFAULT_TOTAL_BLOCKS = 1 << 20      # until an engine states its KV size, a policy sees it as large


def parse_metrics(text: str) -> Scrape:
    """The vLLM gauges and counters the view reads (summed over engine-core labels; DP engines add up)."""
    s = Scrape()
    kv_new: float | None = None
    kv_old: float | None = None
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            name, value = sample.name, sample.value
            if name == "vllm:num_requests_running":
                s.running += int(value)
            elif name == "vllm:num_requests_waiting":
                s.waiting += int(value)
            elif name == "vllm:kv_cache_usage_perc":
                kv_new = max(kv_new or 0.0, value)
            elif name == "vllm:gpu_cache_usage_perc":
                kv_old = max(kv_old or 0.0, value)
            elif name == "vllm:num_preemptions_total":
                s.preemptions_total += value
            elif name == "vllm:prefix_cache_queries_total":
                s.prefix_queries_total += value
            elif name == "vllm:prefix_cache_hits_total":
                s.prefix_hits_total += value
            elif name == "vllm:cache_config_info":
                labels = sample.labels
                if labels.get("num_gpu_blocks", "None").isdigit():
                    s.total_blocks = int(labels["num_gpu_blocks"])
                if labels.get("block_size", "None").isdigit():
                    s.block_size = int(labels["block_size"])
    if kv_new is not None:
        s.kv_usage, s.kv_metric = kv_new, "vllm:kv_cache_usage_perc"
    elif kv_old is not None:      # vLLM before 0.10 (deprecated name)
        s.kv_usage, s.kv_metric = kv_old, "vllm:gpu_cache_usage_perc"
    s.kv_usage = min(max(s.kv_usage, 0.0), 1.0)
    return s


class EnginePool:
    """Every configured engine's view, kept current by a scrape loop; `on_change` runs after each round."""

    def __init__(self, cfg: RouterConfig, client: httpx.AsyncClient, on_change: Callable[[], None]) -> None:
        self.cfg = cfg
        self.client = client
        self.on_change = on_change
        self.views = [EngineView(e.url, i, i, e.total_blocks or DEFAULT_TOTAL_BLOCKS, e.block_size, e.max_num_seqs)
                      for i, e in enumerate(cfg.engines)]
        self.models: dict[int, list[dict]] = {}
        self.on_state: Callable[[EngineView, bool, str], None] = lambda view, up, why: None
        self._task: asyncio.Task | None = None

    def ready(self) -> list[EngineView]:
        return [v for v in self.views if v.ready]

    def mark_down(self, view: EngineView, why: str) -> None:
        if view.ready:
            view.ready = False
            log.warning(f"engine down: {view.url}: {why}", extra={"fields": {"engine": view.url, "reason": why}})
            self.on_state(view, False, why)

    async def scrape(self, view: EngineView) -> None:
        timeout = self.cfg.scrape_timeout_s
        try:
            r = await self.client.get(f"{view.url}/metrics", timeout=timeout)
            r.raise_for_status()
            s = parse_metrics(r.text)
            if view.engine_id not in self.models or not view.ready:
                m = await self.client.get(f"{view.url}/v1/models", timeout=timeout)
                m.raise_for_status()
                self.models[view.engine_id] = list(m.json().get("data", []))
        except (httpx.HTTPError, ValueError, KeyError, AttributeError) as e:
            # refused: nothing listens there; anything else (a busy engine's slow answer): only after a few in a row
            view.scrape_failures += 1
            if isinstance(e, httpx.ConnectError) or view.scrape_failures >= self.cfg.scrape_failures_down:
                self.mark_down(view, f"scrape failed: {type(e).__name__}: {str(e)[:200]}")
            return
        view.scrape_failures = 0
        view.scraped(s)
        if not view.ready:
            view.ready = True
            log.info("engine up", extra={"fields": {"engine": view.url, "kv_metric": s.kv_metric,
                                                   "total_blocks": view.total_blocks}})
            self.on_state(view, True, "scrape ok")

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(v) for v in self.views))
        self.on_change()

    async def _loop(self) -> None:
        while True:
            await self.scrape_all()
            await asyncio.sleep(self.cfg.scrape_interval_s)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def model_list(self) -> list[dict]:
        seen: dict[str, dict] = {}
        for i in sorted(self.models):
            if self.views[i].ready:
                for m in self.models[i]:
                    if isinstance(m, dict) and "id" in m:
                        seen.setdefault(str(m["id"]), m)
        return list(seen.values())
