"""`tierserve router`: serve the tier-aware OpenAI-compatible router (docs/router.md)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console


def register(app: typer.Typer) -> None:
    @app.command("router")
    def router(config: Path = typer.Option(..., "--config", help="Router YAML (engines, tiers, policy, bounds)."),
               check: bool = typer.Option(False, "--check", help="Validate the file, print what it sets, exit."),
               port: Optional[int] = typer.Option(None, "--port", min=0, max=65535,
                                                  help="Listen on this port instead of the file's."),
               log_level: str = typer.Option("info", "--log-level", help="debug | info | warning | error")) -> None:
        """An OpenAI-compatible router in front of vLLM engines: tiers from API keys and headers, per-tier caps
        with overflow rules, dispatch by a cluster policy over the engines' /metrics."""
        from tierserve.core import ConfigError
        from tierserve.router.config import RouterConfig
        if log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError("--log-level", log_level, "debug | info | warning | error")
        cfg = RouterConfig.from_yaml(config)
        if port is not None:
            cfg = cfg.model_copy(update={"port": port})
        if check:
            console = Console()
            console.print(f"{config}: valid — {len(cfg.engines)} engines, tiers "
                          f"{', '.join(t.name for t in cfg.tiers)}, cluster policy {cfg.cluster_policy}, "
                          f"listening on {cfg.host}:{cfg.port}")
            return
        from tierserve.router.serve import serve
        serve(cfg, log_level.lower())
