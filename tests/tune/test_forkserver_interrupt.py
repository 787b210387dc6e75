"""A Ctrl-C in the tuner ends the trial it is running, even one whose script catches
KeyboardInterrupt and goes on (pytorch/examples' word_language_model evaluates and saves)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from trainspeed.tune import forkserver

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not forkserver.available(), reason="fork servers need Linux")]

SCRIPT = """\
import os, sys, time
beat = sys.argv[1]
open(beat, "w").write(f"running {os.getpid()}\\n")
try:
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    for i in range(600):  # what a script does after Ctrl-C: evaluate, save...
        open(beat, "a").write(f"after {i}\\n")
        time.sleep(0.1)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_ctrl_c_in_the_tuner_kills_the_forked_trial_that_catches_it(tmp_path):
    script, beat = tmp_path / "catches.py", tmp_path / "beat.txt"
    script.write_text(SCRIPT)
    server = forkserver.ForkServer()

    def interrupt_once_running() -> None:
        deadline = time.monotonic() + 60
        while not beat.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)  # the terminal's Ctrl-C, as the tuner gets it

    timer = threading.Thread(target=interrupt_once_running, daemon=True)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            server.run(["doctor", "--steps", "0", "--out", str(tmp_path / "run"), "--",
                        "python", str(script), str(beat)], Path(os.devnull), tmp_path / "stderr.txt", 90)
        timer.join()
        pid = int(beat.read_text().split()[1])
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the trial outlived the tuner's Ctrl-C"
        # Killed outright: the script's own KeyboardInterrupt handler never ran in the user's folder
        assert "after" not in beat.read_text()
    finally:
        server.close()
