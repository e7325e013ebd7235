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
KEEP_ALIVE_S = 30       # idle client connections kept this long (uvicorn's 5 s races clients reusing them)


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


def serve(cfg: RouterConfig, log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's handlers stop it gracefully)."""
    configure_logging(log_level)
    uvicorn.run(Router(cfg).app, host=cfg.host, port=cfg.port, log_level="warning", access_log=False,
                lifespan="on", timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=5)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class AppThread:
    """An ASGI app served by uvicorn on a thread of this process, on a loopback port (tests, benchmarks)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None, lifespan: str = "on") -> None:
        self.port = port or free_port(host)
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning",
                                                    access_log=False, lifespan=lifespan,
                                                    timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=5))
        self.server.install_signal_handlers = lambda: None      # not the main thread: leave signals alone
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True,
                                       name=f"asgi-{self.port}")
        self.url = f"http://{host}:{self.port}"

    def start(self):
        self.thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"nothing started on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class RouterThread(AppThread):
    """A router on a loopback port, served by a thread of this process; `with RouterThread(cfg) as r: r.url`."""

    def __init__(self, cfg: RouterConfig, port: int | None = None) -> None:
        self.router = Router(cfg)
        super().__init__(self.router.app, cfg.host, port)
