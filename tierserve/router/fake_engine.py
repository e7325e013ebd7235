"""A stand-in for a vLLM OpenAI server, for the router's fault tests and latency benchmark (no model).

    python -m tierserve.router.fake_engine --port 8101 [--token-delay-s 0.002] [--first-token-delay-s 0]
        [--max-num-seqs 4] [--kv-metric kv_cache_usage_perc|gpu_cache_usage_perc]

It serves /v1/completions and /v1/chat/completions (streamed or not: `max_tokens` tokens, one every
`token-delay-s`, at most `max-num-seqs` at once, the rest waiting), /v1/models, /health and /metrics with the
vLLM gauges the router reads. /debug says what it received: each request's `priority` and `vllm_xargs`, how many
finished and how many the client abandoned (the router's cancellations arrive here as aborts).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tierserve.router.app import ProxyStream, _disconnected

MODEL = "fake-model"
TOTAL_BLOCKS = 256
BLOCK_SIZE = 16


class FakeEngine:
    def __init__(self, token_delay_s: float = 0.002, first_token_delay_s: float = 0.0, max_num_seqs: int = 4,
                 kv_metric: str = "kv_cache_usage_perc", name: str = "fake") -> None:
        self.name = name                 # request ids are NAME-N: unique across engines given distinct names
        self.token_delay_s = token_delay_s
        self.first_token_delay_s = first_token_delay_s
        self.max_num_seqs = max_num_seqs
        self.kv_metric = kv_metric
        self.slots = asyncio.Semaphore(max_num_seqs)
        self.running = 0
        self.waiting = 0
        self.received: list[dict] = []
        self.finished = 0
        self.aborted = 0
        self.app = Starlette(routes=[Route("/v1/completions", self.complete, methods=["POST"]),
                                     Route("/v1/chat/completions", self.complete, methods=["POST"]),
                                     Route("/v1/models", self.models), Route("/health", self.health),
                                     Route("/metrics", self.metrics), Route("/debug", self.debug)])

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fake"}]})

    async def debug(self, request: Request) -> Response:
        return JSONResponse({"received": self.received, "finished": self.finished, "aborted": self.aborted,
                             "running": self.running, "waiting": self.waiting})

    async def metrics(self, request: Request) -> Response:
        usage = min(1.0, self.running * 4 / TOTAL_BLOCKS)
        lines = [f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} {self.running}',
                 f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} {self.waiting}',
                 f'vllm:{self.kv_metric}{{engine="0",model_name="{MODEL}"}} {usage}',
                 f'vllm:num_preemptions_total{{engine="0",model_name="{MODEL}"}} 0.0',
                 f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",engine="0",num_gpu_blocks="{TOTAL_BLOCKS}"}} 1.0']
        return PlainTextResponse("\n".join(lines) + "\n")

    async def complete(self, request: Request) -> Response:
        body = await request.json()
        chat = request.url.path.endswith("chat/completions")
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        self.received.append({"path": request.url.path, "priority": body.get("priority"),
                              "vllm_xargs": body.get("vllm_xargs"), "stream": bool(body.get("stream")),
                              "service_tier": body.get("service_tier"), "max_tokens": n})
        rid = f"{self.name}-{len(self.received)}"
        if body.get("stream"):
            return ProxyStream(self._events(rid, chat, n), {})
        work = asyncio.ensure_future(self._generate(n))
        gone = asyncio.ensure_future(_disconnected(request))
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            self.aborted += 1
            return Response(status_code=499)
        self.finished += 1
        text = " ".join(work.result())
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": text, "finish_reason": "length"})
        return JSONResponse({"id": rid, "object": "chat.completion" if chat else "text_completion",
                             "created": int(time.time()), "model": MODEL, "choices": [choice],
                             "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}})

    async def _slot(self):
        self.waiting += 1
        await self.slots.acquire()
        self.waiting -= 1
        self.running += 1

    def _free(self) -> None:
        self.running -= 1
        self.slots.release()

    async def _generate(self, n: int) -> list[str]:
        await self._slot()
        try:
            await asyncio.sleep(self.first_token_delay_s + self.token_delay_s * n)
            return [f"t{i}" for i in range(n)]
        finally:
            self._free()

    async def _events(self, rid: str, chat: bool, n: int):
        done = False
        try:
            await self._slot()
            try:
                await asyncio.sleep(self.first_token_delay_s)
                for i in range(n):
                    await asyncio.sleep(self.token_delay_s)
                    delta = ({"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": None} if chat
                             else {"index": 0, "text": f" t{i}", "finish_reason": None})
                    obj = "chat.completion.chunk" if chat else "text_completion"
                    yield (f'data: {{"id":"{rid}","object":"{obj}","model":"{MODEL}","choices":'
                           f'[{_json(delta)}]}}\n\n').encode()
                yield b"data: [DONE]\n\n"
                done = True
            finally:
                self._free()
        finally:
            if done:
                self.finished += 1
            else:
                self.aborted += 1


def _json(obj) -> str:
    import json
    return json.dumps(obj, separators=(",", ":"))


def main(argv: list[str] | None = None) -> None:
    import uvicorn
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token-delay-s", type=float, default=0.002)
    ap.add_argument("--first-token-delay-s", type=float, default=0.0)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--kv-metric", default="kv_cache_usage_perc", choices=["kv_cache_usage_perc",
                                                                           "gpu_cache_usage_perc"])
    a = ap.parse_args(argv)
    engine = FakeEngine(a.token_delay_s, a.first_token_delay_s, a.max_num_seqs, a.kv_metric, f"fake{a.port}")
    uvicorn.run(engine.app, host="127.0.0.1", port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
