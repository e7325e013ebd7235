"""The router as an ASGI app (Starlette): OpenAI-compatible endpoints in front of vLLM engines.

    POST /v1/chat/completions, /v1/completions   (stream or not)    GET /v1/models
    GET /health (the process is up), /ready (some engine is ready), /metrics (Prometheus), /stats (JSON)

Every request that reaches a completions endpoint ends exactly once, with one outcome (`metrics.py`), counted in
`Router.outcomes`, `tierserve:requests_total` and one JSON log line. The client leaving cancels the engine
request (the connection to the engine is closed; vLLM aborts a request whose client went away).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import Counter
from typing import Any, AsyncIterator

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tierserve.engines.vllm.mapping import vllm_request_fields
from tierserve.policies.cluster import CLUSTER_POLICIES
from tierserve.router.config import RouterConfig
from tierserve.router.dispatch import Dispatcher, Ticket, engines_json
from tierserve.router.engines import EnginePool
from tierserve.router.metrics import RouterMetrics
from tierserve.router.tiers import RequestRefused, TierResolver

log = logging.getLogger("tierserve.router")

CHARS_PER_TOKEN = 4            # prompt length estimate for the policy's KV demand (the router does not tokenize)
DEFAULT_MAX_TOKENS = 16        # OpenAI's default for completions; only the policy's view reads it
ROUTER_SET_FIELDS = ("priority", "service_tier")   # the router decides these; the client's values never pass


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """Token-id lists exactly; text at ~CHARS_PER_TOKEN characters per token."""
    def of(p: Any) -> int:
        if isinstance(p, str):
            return math.ceil(len(p) / CHARS_PER_TOKEN)
        if isinstance(p, list):
            if p and all(isinstance(x, int) for x in p):
                return len(p)
            return sum(of(x) for x in p)
        if isinstance(p, dict):          # a chat message or a content part
            return of(p.get("content")) + of(p.get("text"))
        return 0
    return max(1, of(body.get("prompt")) + of(body.get("messages")))


def _max_tokens(body: dict[str, Any]) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        v = body.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise RequestRefused(400, f"{key}: got {str(v)[:40]!r}; allowed: an integer >= 1", key)
        return v
    return DEFAULT_MAX_TOKENS


class Router:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.metrics = RouterMetrics()
        self.resolver = TierResolver(cfg)
        self.policy = CLUSTER_POLICIES.create(cfg.cluster_policy, **cfg.cluster_policy_params)
        self.names = [t.name for t in cfg.tiers]
        self.outcomes: Counter[str] = Counter()
        self.client: httpx.AsyncClient | None = None
        self.pool: EnginePool | None = None
        self.dispatcher: Dispatcher | None = None
        routes = [Route("/v1/chat/completions", self.completions, methods=["POST"]),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/models", self.models, methods=["GET"]),
                  Route("/health", self.health, methods=["GET"]),
                  Route("/ready", self.ready, methods=["GET"]),
                  Route("/metrics", self.prometheus, methods=["GET"]),
                  Route("/stats", self.stats, methods=["GET"])]
        self.app = Starlette(routes=routes, lifespan=self._lifespan)

    # ---- life ---------------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        cfg = self.cfg
        # idle engine connections closed before uvicorn's 5 s (vLLM's server) can close them under a reuse
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=2.0)
        self.client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(cfg.engine_timeout_s,
                                                                             connect=cfg.connect_timeout_s))
        self.pool = EnginePool(cfg, self.client, on_change=self._scraped)
        self.pool.on_state = lambda view, up, why: self.metrics.engine_up.labels(view.url).set(1 if up else 0)
        for v in self.pool.views:
            self.metrics.engine_up.labels(v.url).set(0)
        self.dispatcher = Dispatcher(cfg, self.pool, self.policy, self.metrics)
        await self.pool.scrape_all()
        self.pool.start()
        log.info("router up", extra={"fields": {"engines": [v.url for v in self.pool.views],
                                               "ready": len(self.pool.ready()), "policy": cfg.cluster_policy}})
        try:
            yield
        finally:
            await self.pool.stop()
            await self.client.aclose()

    def _scraped(self) -> None:
        for v in self.pool.views:
            self.metrics.engine_outstanding.labels(v.url).set(v.num_outstanding)
            self.metrics.engine_kv_usage.labels(v.url).set(v.last.kv_usage)
        self.dispatcher.drain()

    # ---- small endpoints ----------------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        n = len(self.pool.ready())
        return JSONResponse({"ready": n > 0, "engines_ready": n, "engines": len(self.pool.views)},
                            status_code=200 if n else 503)

    async def prometheus(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def stats(self, request: Request) -> Response:
        return JSONResponse({"outcomes": dict(self.outcomes), **self.dispatcher.snapshot(),
                             "engines": engines_json(self.pool.views)})

    async def models(self, request: Request) -> Response:
        if not self.pool.ready():
            e = self.dispatcher.unavailable(self.cfg.default_tier_index)
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
        return JSONResponse({"object": "list", "data": self.pool.model_list()})

    # ---- completions --------------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        t0 = time.monotonic()
        tk: Ticket | None = None
        try:
            body = await self._read_json(request)
            resolved = self.resolver.resolve(request.headers, body)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                raise RequestRefused(400, f"stream: got {str(stream)[:40]!r}; allowed: true or false", "stream")
            tk = self.dispatcher.ticket(resolved.tier, resolved.slo, estimate_prompt_tokens(body), _max_tokens(body))
            if self.dispatcher.admit(tk) is None:
                await self._wait_in_queue(request, tk)
            payload = self._payload(body, tk)
            if stream:
                return await self._stream(request, tk, payload, t0)
            return await self._unary(request, tk, payload, t0)
        except RequestRefused as e:
            if tk is not None:
                self.dispatcher.release(tk)
            self._end(tk, e.outcome, e.status, t0, detail=e.message)
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
        except asyncio.CancelledError:
            if tk is not None:
                self.dispatcher.release(tk)
            self._end(tk, "cancelled", 499, t0)
            raise

    async def _read_json(self, request: Request) -> dict[str, Any]:
        limit = self.cfg.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestRefused(413, f"body: {declared} bytes; allowed: at most {limit} (max_body_bytes)", None)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestRefused(413, f"body: over {limit} bytes; allowed: at most {limit} (max_body_bytes)",
                                     None)
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestRefused(400, f"body: not JSON ({str(e)[:200]})", None) from None
        if not isinstance(body, dict):
            raise RequestRefused(400, f"body: got a JSON {type(body).__name__}; allowed: a JSON object", None)
        return body

    def _payload(self, body: dict[str, Any], tk: Ticket) -> dict[str, Any]:
        """The body as the engine gets it: tier and SLO as `tierserve.engines.vllm` reads them."""
        out = {k: v for k, v in body.items() if k not in ROUTER_SET_FIELDS}
        fields = vllm_request_fields(tk.tier, tk.slo)
        xargs = body.get("vllm_xargs")
        mine = fields["vllm_xargs"]
        keep = {k: v for k, v in xargs.items() if k not in ("tier", "ttft_s", "tbt_s", "ttlt_s")} \
            if isinstance(xargs, dict) else {}
        out["priority"] = fields["priority"]
        out["vllm_xargs"] = {**keep, **mine}
        return out

    async def _wait_in_queue(self, request: Request, tk: Ticket) -> None:
        waiting = asyncio.ensure_future(self.dispatcher.wait(tk))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not waiting.done():
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
                gone.cancel()
                raise RequestRefused(499, "the client left while queued", None, outcome="cancelled")
            gone.cancel()
        waiting.result()                         # raises the queue's RequestRefused (429/503)

    def _url(self, tk: Ticket, path: str) -> str:
        return f"{tk.engine.url}{path}"

    async def _send(self, request: Request, tk: Ticket, payload: dict[str, Any], stream: bool) -> httpx.Response:
        """POST to the ticket's engine; an engine that refuses the connection never saw the request: marked
        down, and the request goes to another ready engine (503 when none is left)."""
        while True:
            req = self.client.build_request("POST", self._url(tk, request.url.path), json=payload,
                                            headers=_forward_headers(request))
            try:
                return await self.client.send(req, stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                self.pool.mark_down(tk.engine, f"connect failed: {type(e).__name__}")
                if self.dispatcher.retry_elsewhere(tk) is None:
                    raise self.dispatcher.unavailable(tk.asked_tier) from None

    async def _unary(self, request: Request, tk: Ticket, payload: dict[str, Any], t0: float) -> Response:
        call = asyncio.ensure_future(self._send(request, tk, payload, stream=False))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not call.done():                  # the client left: closing the connection aborts it at vLLM
                call.cancel()
                with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError, RequestRefused):
                    await call
                self.dispatcher.release(tk)
                self._end(tk, "cancelled", 499, t0)
                return Response(status_code=499)
        finally:
            gone.cancel()
        try:
            resp = call.result()
        except httpx.TimeoutException:
            return self._engine_failed(tk, t0, 504, "engine_timeout", "the engine did not answer in time")
        except httpx.HTTPError as e:
            self.pool.mark_down(tk.engine, f"failed mid-request: {type(e).__name__}")
            return self._engine_failed(tk, t0, 502, "error", f"the engine failed: {type(e).__name__}")
        self.dispatcher.release(tk)
        served = self.cfg.tiers[tk.tier].echo
        try:
            data = resp.json()
        except ValueError:
            data = None
        if resp.status_code != 200 or not isinstance(data, dict):
            self._end(tk, "engine_refused", resp.status_code, t0)
            return Response(resp.content, status_code=resp.status_code,
                            media_type=resp.headers.get("content-type"))
        data["service_tier"] = served
        ttlt = time.monotonic() - t0
        self._end(tk, "finished", 200, t0, ttft=ttlt)
        return JSONResponse(data, headers={"x-tierserve-tier": self.names[tk.tier]})

    def _engine_failed(self, tk: Ticket, t0: float, status: int, outcome: str, message: str) -> Response:
        self.dispatcher.release(tk)
        self._end(tk, outcome, status, t0, detail=message)
        e = RequestRefused(status, message, None, outcome=outcome, kind="server_error")
        return JSONResponse(e.body(), status_code=status)

    async def _stream(self, request: Request, tk: Ticket, payload: dict[str, Any], t0: float) -> Response:
        try:
            resp = await self._send(request, tk, payload, stream=True)
        except httpx.TimeoutException:
            return self._engine_failed(tk, t0, 504, "engine_timeout", "the engine did not answer in time")
        except httpx.HTTPError as e:
            self.pool.mark_down(tk.engine, f"failed mid-request: {type(e).__name__}")
            return self._engine_failed(tk, t0, 502, "error", f"the engine failed: {type(e).__name__}")
        if resp.status_code != 200:
            content = await resp.aread()
            await resp.aclose()
            self.dispatcher.release(tk)
            self._end(tk, "engine_refused", resp.status_code, t0)
            return Response(content, status_code=resp.status_code, media_type=resp.headers.get("content-type"))
        return ProxyStream(self._relay(tk, resp, t0), {"x-tierserve-tier": self.names[tk.tier]})

    async def _relay(self, tk: Ticket, resp: httpx.Response, t0: float) -> AsyncIterator[bytes]:
        """The engine's server-sent events with `service_tier` set in each chunk; a failure mid-stream ends the
        stream with an error event (the client sees why), and the request ends exactly once whatever happens."""
        served = self.cfg.tiers[tk.tier].echo
        outcome, status, ttft, detail = "finished", 200, None, ""
        try:
            try:
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        if ttft is None:
                            ttft = time.monotonic() - t0
                        try:
                            chunk = json.loads(line[6:])
                            chunk["service_tier"] = served
                            line = "data: " + json.dumps(chunk, separators=(",", ":"))
                        except ValueError:
                            pass
                    yield (line + "\n").encode()
            except httpx.TimeoutException:
                outcome, status, detail = "engine_timeout", 504, "the engine went silent mid-stream"
            except httpx.HTTPError as e:
                self.pool.mark_down(tk.engine, f"failed mid-stream: {type(e).__name__}")
                outcome, status, detail = "error", 502, f"the engine failed mid-stream: {type(e).__name__}"
            if outcome != "finished":
                err = RequestRefused(status, detail, None, outcome=outcome, kind="server_error").body()
                yield f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()
        except (asyncio.CancelledError, GeneratorExit):
            outcome, status = "cancelled", 499
            raise
        finally:
            with contextlib.suppress(Exception):
                await resp.aclose()
            self.dispatcher.release(tk)
            self._end(tk, outcome, status, t0, ttft=ttft, detail=detail)

    # ---- accounting ---------------------------------------------------------------------------------------
    def _end(self, tk: Ticket | None, outcome: str, status: int, t0: float, ttft: float | None = None,
             detail: str = "") -> None:
        asked = self.names[tk.asked_tier] if tk is not None else "unknown"
        served = self.names[tk.tier] if tk is not None and tk.engine is not None else "none"
        ttlt = time.monotonic() - t0
        self.outcomes[outcome] += 1
        self.metrics.requests.labels(asked, served, outcome).inc()
        if outcome == "finished":
            self.metrics.ttlt.labels(served).observe(ttlt)
            if ttft is not None:
                self.metrics.ttft.labels(served).observe(ttft)
        if self.cfg.log_requests:
            log.info("request", extra={"fields": {
                "id": tk.id if tk is not None else None, "tier": asked, "served_tier": served,
                "engine": tk.engine.url if tk is not None and tk.engine is not None else None,
                "outcome": outcome, "status": status, "ttft_s": ttft, "ttlt_s": round(ttlt, 6),
                **({"detail": detail} if detail else {})}})


def _forward_headers(request: Request) -> dict[str, str]:
    """Headers the engine may read (vLLM's own request id and tracing); not the client's credentials."""
    keep = ("x-request-id", "traceparent", "tracestate")
    return {k: v for k, v in request.headers.items() if k in keep}


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body is already read: the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class ProxyStream(StreamingResponse):
    """A streamed answer that notices the client leaving while the engine is still silent: the relay is then
    cancelled (closing the engine connection) and always closed, so its accounting runs exactly once."""

    def __init__(self, chunks: AsyncIterator[bytes], headers: dict[str, str]) -> None:
        super().__init__(chunks, status_code=200, headers=headers, media_type="text/event-stream")
        self.chunks = chunks

    async def __call__(self, scope, receive, send) -> None:
        async def pump() -> None:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def listen() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        pumping = asyncio.ensure_future(pump())
        listening = asyncio.ensure_future(listen())
        try:
            await asyncio.wait({pumping, listening}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pumping, listening):
                task.cancel()
            with contextlib.suppress(BaseException):
                await pumping
            with contextlib.suppress(BaseException):
                await listening
            await self.chunks.aclose()
