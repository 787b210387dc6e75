"""What a script said when it exited on its own (SystemExit) before training: argparse's error
line (`main.py: error: unrecognized arguments: --epochz 1`) is the usual first-run case, and the
report quotes it so the user sees their own command was wrong, not their training loop."""

from __future__ import annotations

import argparse


def exit_message(exc: SystemExit) -> str | None:
    """The last line the script printed as it exited: the message argparse's `exit` printed
    (its frame is still in the traceback; the doctor does not capture stderr), or a string
    passed to sys.exit; None when it said nothing (`--help` printed and exited 0)."""
    if isinstance(exc.code, str):
        return _last_line(exc.code)
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is argparse.ArgumentParser.exit.__code__:
            message = frame.f_locals.get("message")
            return _last_line(message) if isinstance(message, str) else None
        tb = tb.tb_next
    return None


def _last_line(text: str) -> str | None:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None
