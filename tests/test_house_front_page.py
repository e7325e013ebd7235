"""Issue 22, tried as a newcomer would, from the README alone: its first lines name the main job and it runs;
every page it links exists; its table of pages leads to the policy-author guide, the guide to its example file,
and the guide's own `tierserve simulate` command runs that example (registered by the guide's one line)."""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tierserve.cli import app
from tierserve.cli.simulate_cmds import MAIN_JOB_STACKS
from tierserve.policies.local import LOCAL_POLICIES

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)#\s]+)(?:#[^)]*)?\)")


def invoke(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def relative_links(page: Path) -> list[Path]:
    return [(page.parent / target).resolve() for target in LINK.findall(page.read_text())
            if not re.match(r"[a-z]+:", target)]


def main_job_command() -> list[str]:
    """The command README's second line says runs the main job (after the install step)."""
    line = README.read_text().splitlines()[1]
    m = re.search(r"main job: `(?:[^`]*&& )?(tierserve [^`]*)`", line)
    assert m, f"README line 2 names no main-job command: {line!r}"
    return shlex.split(m.group(1))


def test_the_readme_names_the_main_job_and_it_runs():
    cmd = main_job_command()
    assert cmd == ["tierserve", "simulate"]
    # the command as written, on fewer requests (the default scenario's 3,000 take minutes in pure Python)
    out = invoke(cmd[1:] + ["-n", "150", "--executor", "serial"])
    assert "default scenario" in out
    for stack in MAIN_JOB_STACKS:
        assert stack in out
    assert "stable" in out                       # each stack's queue verdict is printed


def test_every_page_the_readme_links_exists():
    links = relative_links(README)
    assert len(links) >= 10
    missing = [str(p.relative_to(ROOT)) for p in links if not p.exists()]
    assert not missing, f"README links to missing pages: {missing}"


def policy_guide() -> Path:
    """The page README's table offers for writing a policy."""
    rows = [line for line in README.read_text().splitlines() if line.startswith("|") and "policy" in line
            and "example" in line]
    assert rows, "README's table of pages has no row for writing a policy"
    return (README.parent / LINK.search(rows[0]).group(1)).resolve()


def guide_registry_line(guide: Path) -> tuple[str, str]:
    m = re.search(r'^\s*"(\w+)": "([\w.]+:\w+)",\s*$', guide.read_text(), re.M)
    assert m, "the guide shows no registry line"
    return m.group(1), m.group(2)


@pytest.fixture
def guide_policy(monkeypatch):
    """The guide's example registered by its one line, from where the guide says the file lies."""
    guide = policy_guide()
    examples = [p for p in relative_links(guide) if p.suffix == ".py" and "examples" in p.parts]
    assert examples and all(p.exists() for p in examples), f"the guide's example file is missing: {examples}"
    name, path = guide_registry_line(guide)
    module, cls = path.split(":")
    example = next(p for p in examples if p.stem == module.rsplit(".", 1)[-1])
    monkeypatch.syspath_prepend(str(example.parent))
    monkeypatch.setitem(LOCAL_POLICIES.table, name, f"{example.stem}:{cls}")
    yield guide, name
    sys.modules.pop(example.stem, None)


def test_the_readme_leads_to_the_policy_guide_whose_simulate_command_runs_its_example(guide_policy, tmp_path,
                                                                                        monkeypatch):
    guide, name = guide_policy
    assert guide == (ROOT / "docs" / "writing-a-policy.md").resolve()
    commands = [shlex.split(line.split("#")[0]) for line in guide.read_text().splitlines()
                if line.startswith("tierserve simulate") and f"-l {name}" in line and " -o " in line]
    assert commands, "the guide shows no `tierserve simulate -l NAME ... -o DIR` command"
    monkeypatch.chdir(tmp_path)
    cmd = commands[0]
    out = invoke(cmd[1:])
    folder = tmp_path / cmd[cmd.index("-o") + 1]
    assert f"{name} + " in out
    assert (folder / "summary.json").exists() and (folder / "manifest.json").exists()
