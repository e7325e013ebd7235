"""The engine's results.json goes through the output layer (issue 29): atomic, and a FIFO target is refused."""
import json
import os

import pytest

from tierserve.core.errors import ConfigError
from tierserve.engines.vllm.run import write_results


def test_results_json_is_written_whole(tmp_path):
    write_results(tmp_path, {"wall_s": 1.5, "requests": []})
    assert json.loads((tmp_path / "results.json").read_text()) == {"wall_s": 1.5, "requests": []}
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_results_json_refuses_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "results.json")     # the old write_text would block on it forever
    with pytest.raises(ConfigError, match="results.json"):
        write_results(tmp_path, {"wall_s": 1.0})
