"""The doctor that goes in under a launcher (`trainspeed doctor -- torchrun|accelerate launch ...`)
waits for it: a SIGTERM sent to it alone reaches the launcher, whose ranks then stop and write
their reports. Before, the doctor died and left the launcher running to --steps without it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

SRC = str(Path(__file__).resolve().parents[2] / "src")
LAUNCHER = textwrap.dedent('''
    import signal, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    def stop(signum, frame):
        out.write_text(f"stopped by {signum}")
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    out.write_text("running")
    time.sleep(30)
    out.write_text("ran to the end")
''')
PARENT = ("import os, sys; from trainspeed.cli._launchers import wait_for_launcher; "
          "sys.exit(wait_for_launcher([sys.executable, sys.argv[1], sys.argv[2]], dict(os.environ)))")


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    marker = tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": SRC}
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "launcher.py"), str(marker)], env=env)
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return parent, marker


def test_a_sigterm_to_the_doctor_goes_on_to_the_launcher(tmp_path):
    parent, marker = _start(tmp_path)
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=20) == 128 + signal.SIGTERM  # the launcher's own status
    assert marker.read_text() == f"stopped by {int(signal.SIGTERM)}"


def test_a_sigint_to_the_doctor_alone_does_not_leave_the_launcher(tmp_path):
    # at a terminal Ctrl-C reaches the launcher itself (one process group); the doctor waits
    parent, marker = _start(tmp_path)
    parent.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert parent.poll() is None and marker.read_text() == "running"
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=20) == 128 + signal.SIGTERM
