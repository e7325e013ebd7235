"""docs/fidelity.md states only what its commands print: every block is rerun and each of its lines must be in the
fresh output, every decimal within 1% (or one unit of its last printed digit), every integer exactly."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from conftest import load_script
from tierserve.core.paths import shared_data

DOC = Path(__file__).resolve().parents[1] / "docs" / "fidelity.md"
_NUMBER = re.compile(r"(?<![\w.])[+\-−]?\d[\d,]*(?:\.\d+)?")   # not the 100 of A100


def doc_blocks() -> list[tuple[list[str], list[str]]]:
    """(commands, claimed lines) of each ```text block of the doc whose first line is a `$ command`."""
    out = []
    for body in re.findall(r"```text\n(.*?)```", DOC.read_text(), flags=re.S):
        lines = body.strip("\n").splitlines()
        cmds = [ln[2:] for ln in lines if ln.startswith("$ ")]
        if cmds:
            out.append((cmds, [ln for ln in lines if not ln.startswith("$ ") and ln.strip()]))
    return out


def run_command(cmd: str) -> str:
    """Output of one documented command, run in this process (a repository script's main, or the CLI)."""
    args = shlex.split(cmd)
    buf = io.StringIO()
    if args[0] == "python":
        mod = load_script(args[1], Path(args[1]).stem + "_doc")
        with contextlib.redirect_stdout(buf):
            mod.main(args[2:])
        return buf.getvalue()
    assert args[0] == "tierserve", cmd
    from typer.testing import CliRunner

    from tierserve.cli import app
    r = CliRunner().invoke(app, args[1:])
    assert r.exit_code == 0, r.output
    return r.output


def _value(text: str) -> float:
    return float(text.replace("−", "-").replace(",", ""))


def find_claim(line: str, output: str) -> str | None:
    """None when `line` is in `output` (whitespace-insensitive) with every number within tolerance, else why not."""
    norm = " ".join(output.split())
    claim = " ".join(line.split())
    parts = _NUMBER.split(claim)
    numbers = _NUMBER.findall(claim)
    pattern = _NUMBER.pattern.join(re.escape(p) for p in parts).replace(_NUMBER.pattern, f"({_NUMBER.pattern})")
    best = None
    for m in re.finditer(pattern, norm):
        bad = []
        for want, got in zip(numbers, m.groups()):
            if "." not in want:                     # counts and sizes: exactly
                tol = 0.0
            else:                                   # measurements: 1% or one unit of the last printed digit
                tol = max(0.01 * abs(_value(want)), 10 ** -len(want.split(".")[1]) * 1.0001)
            if abs(_value(got) - _value(want)) > tol:
                bad.append(f"{want} now {got}")
        if not bad:
            return None
        best = best or "; ".join(bad)
    return best or "line not in the output"


def test_claim_matching_refuses_a_changed_number():
    out = "MAPE over 20 shapes: 3.59% (target ≤ 5.0%)\n"
    assert find_claim("MAPE over 20 shapes: 3.59% (target ≤ 5.0%)", out) is None
    assert find_claim("MAPE over 20 shapes: 3.61% (target ≤ 5.0%)", out) is None      # within 1%
    assert "3.80 now 3.59" in find_claim("MAPE over 20 shapes: 3.80% (target ≤ 5.0%)", out)
    assert find_claim("MAPE over 21 shapes: 3.59% (target ≤ 5.0%)", out) is not None
    assert find_claim("something else", out) == "line not in the output"


@pytest.mark.skipif(shared_data("vidur") is None or shared_data("real_gpu") is None,
                    reason="../shared/data absent: the doc's figures cannot be recomputed")
def test_every_figure_of_docs_fidelity_is_what_its_command_prints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = doc_blocks()
    assert len(blocks) >= 4
    stale = []
    for cmds, claims in blocks:
        output = "".join(run_command(c) for c in cmds)
        for line in claims:
            why = find_claim(line, output)
            if why:
                stale.append(f"{cmds[-1]}: {line.strip()!r}: {why}")
    assert not stale, "\n".join(stale)
