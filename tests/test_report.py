"""`tierserve report DIR`: every embedded image is a valid, non-empty PNG, and a headless browser loads the
page without a console message and takes a screenshot."""
from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess

import numpy as np
import pytest

from tierserve.core import ConfigError
from tierserve.experiments.scenario import ScenarioConfig, run_scenario, write_result
from tierserve.report.html import detect, write_report

IMG = re.compile(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'")


def _run(path, stack: str, n: int = 300):
    local, _, glob = stack.partition("+")
    cfg = ScenarioConfig.from_dict({"cluster": {"num_replicas": 2, "local_policy": local, "cluster_policy": glob},
                                    "workload": {"num_requests": n, "arrivals": {"kind": "poisson", "rate": 8.0}}})
    write_result(run_scenario(cfg), path)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from tierserve.experiments.plan import PlanMix
    from tierserve.experiments.plan_whatif import plan_fleet
    from tierserve.experiments.plan_output import write_plan
    from tierserve.experiments.sweep import Sweep, run_sweep
    root = tmp_path_factory.mktemp("reports")
    _run(root / "run", "vllm+round_robin")
    for st in ("vllm+round_robin", "vllm_priority+round_robin"):
        _run(root / "cmp" / st.replace("+", "__"), st)
    run_sweep(Sweep.from_dict({"name": "s", "seeds": [0, 1],
                               "base": {"cluster": {"num_replicas": 2}, "workload": {"num_requests": 200}},
                               "params": {"rate": [4.0, 8.0]}}), root / "sweep", executor="serial", progress=False)
    mix = PlanMix.from_dict({"rate": 10.0, "workload": {"num_requests": 300},
                             "search": {"gpus": ["A100-80GB"], "tp": [1], "stacks": ["vllm_priority+round_robin"],
                                        "seeds": [0, 1]}})
    write_plan(plan_fleet(mix, executor="serial", progress=False, extras=False), root / "plan")
    return root


@pytest.fixture(scope="module")
def pages(folders):
    """Each kind's report, written once for the module's tests."""
    return {kind: write_report(folders / kind) for kind in ("run", "cmp", "sweep", "plan")}


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(b) for b in IMG.findall(page)]


@pytest.mark.parametrize("kind, n_images", [("run", 3), ("cmp", 3), ("sweep", 2), ("plan", 1)])
def test_every_image_is_a_valid_non_empty_png(folders, pages, kind, n_images):
    from PIL import Image
    page = pages[kind].read_text(encoding="utf-8")
    assert detect(folders / kind) == {"cmp": "comparison"}.get(kind, kind)
    images = _images(page)
    assert len(images) >= n_images
    assert page.count("<img") == len(images)            # no image is anything but an embedded PNG
    for raw in images:
        img = Image.open(io.BytesIO(raw))
        img.verify()
        pixels = np.asarray(Image.open(io.BytesIO(raw)).convert("L"), dtype=float)
        assert min(pixels.shape) > 100 and pixels.std() > 1.0     # drawn on, not a blank canvas
    assert "<script" not in page and "http" not in page.split("<body>")[1].split("from ")[0]


def test_missing_time_series_are_said(pages):
    page = pages["run"].read_text(encoding="utf-8")
    assert "KV-cache use over time is not in the run outputs" in page


def test_a_folder_that_is_no_output_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="DIR"):
        detect(tmp_path)


def _chromium(page, shot, size="1300,2400"):
    proc = subprocess.run([shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu",
                           "--enable-logging=stderr", "--v=0", "--hide-scrollbars", f"--window-size={size}",
                           f"--screenshot={shot}", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (.ci/run installs it: apt-get install -y chromium)")
def test_headless_browser_loads_the_page_without_console_errors(pages, tmp_path):
    from PIL import Image
    planted = tmp_path / "planted.html"          # the check itself must be able to fail
    planted.write_text("<html><body><script>console.error('planted')</script></body></html>")
    assert any("planted" in line for line in _chromium(planted, tmp_path / "planted.png", "400,300"))
    page = pages["plan"]
    shot = tmp_path / "plan.png"
    assert _chromium(page, shot) == []
    img = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert img.shape[1] == 1300 and img.std() > 5.0
