"""The engine's live logs (iteration, decision, request log) through the output layer's checks (issue 29): a
FIFO or device node is refused naming the setting instead of blocking the engine's start or being written."""
from __future__ import annotations

import os
import signal

import pytest

from tierserve.core.errors import ConfigError
from tierserve.engines.vllm.logs import DecisionLog, IterationLog, RequestLog


@pytest.mark.parametrize("log, field", [(IterationLog, "tierserve.iteration_log"),
                                        (DecisionLog, "tierserve.decision_log"),
                                        (RequestLog, "tierserve.request_log")])
def test_a_fifo_or_device_log_is_refused_naming_the_setting(tmp_path, log, field):
    fifo = tmp_path / "log"
    os.mkfifo(fifo)

    def timeout(signum, frame):
        raise TimeoutError("the log's open blocked on a FIFO")
    old = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(5)
    try:
        for target, what in ((fifo, "FIFO"), ("/dev/null", "device node")):
            with pytest.raises(ConfigError, match=what) as e:
                log(target)
            assert e.value.field == field and str(target) in str(e.value)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert fifo.is_fifo()


def test_a_regular_log_is_still_written(tmp_path):
    log = IterationLog(tmp_path / "sub" / "iterations.csv")
    log.close()
    assert (tmp_path / "sub" / "iterations.csv").read_text().startswith("prefill_tokens,")
