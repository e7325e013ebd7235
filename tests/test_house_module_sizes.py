"""No module over 600 lines without its reason at the top (issue 22): a longer source file of tierserve/,
benchmarks/ or scripts/ says why in its first 40 lines, in a line starting `Over 600 lines:`."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 600


def test_long_modules_say_why() -> None:
    tracked = subprocess.run(["git", "ls-files", "tierserve", "benchmarks", "scripts"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
    silent = []
    for name in tracked:
        path = ROOT / name
        if path.suffix != ".py" or not path.is_file():
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > LIMIT and not any(l.strip().startswith("Over 600 lines:") for l in lines[:40]):
            silent.append(f"{name} ({len(lines)} lines)")
    assert not silent, f"over {LIMIT} lines with no 'Over 600 lines:' reason in the first 40 lines: {silent}"
