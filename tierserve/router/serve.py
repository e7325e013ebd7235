"""Serving the router with uvicorn: in the foreground (`tierserve router`), or on a thread of this process
(`RouterThread`: tests and the latency benchmark), with one JSON object per log line."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time

import uvicorn

from tierserve.router.app import Router
from tierserve.router.config import RouterConfig

STARTUP_TIMEOUT_S = 30.0


class JsonLines(logging.Formatter):
    """Structured logs: {"ts", "level", "logger", "msg", ...the record's `fields`}."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 6), "level": record.levelname.lower(), "logger": record.name,
               "msg": record.getMessage()}
        out.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "info") -> None:
    logger = logging.getLogger("tierserve.router")
    if not any(isinstance(h.formatter, JsonLines) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(JsonLines())
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def uvicorn_config(router: Router, port: int | None = None, log_level: str = "warning") -> uvicorn.Config:
    cfg = router.cfg
    return uvicorn.Config(router.app, host=cfg.host, port=cfg.port if port is None else port, log_level=log_level,
                          access_log=False, lifespan="on", timeout_graceful_shutdown=5)


def serve(cfg: RouterConfig, log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers stop it gracefully)."""
    configure_logging(log_level)
    uvicorn.Server(uvicorn_config(Router(cfg), log_level="warning")).run()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class RouterThread:
    """A router on a loopback port, served by a thread of this process; `with RouterThread(cfg) as r: r.url`."""

    def __init__(self, cfg: RouterConfig, port: int | None = None) -> None:
        self.router = Router(cfg)
        self.port = port or free_port(cfg.host)
        self.server = uvicorn.Server(uvicorn_config(self.router, self.port))
        self.server.install_signal_handlers = lambda: None      # not the main thread: leave signals alone
        self.thread = threading.Thread(target=self._run, name="tierserve-router", daemon=True)
        self.url = f"http://{cfg.host}:{self.port}"

    def _run(self) -> None:
        asyncio.run(self.server.serve())

    def start(self) -> "RouterThread":
        self.thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the router did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

    def __enter__(self) -> "RouterThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
