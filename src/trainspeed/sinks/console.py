"""ConsoleSink: one live status line while training runs.

  step 120/1000 loss 2.3100 | 1,234 samples/s 56.7k tok/s | data 12% fwd 30% bwd 45% opt 8% | ETA 1m23s

On a terminal the line is redrawn in place with rich; on anything else (pipes, CI logs,
pytest capture) it degrades to plain lines printed at most every `every_s` seconds, so a
log file does not get one line per step. Events (checkpoint, eval, anomaly, ...) print one
line each. Rates and phase shares are over a fixed window of recent records (fixed memory).
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from trainspeed.errors import ConfigError
from trainspeed.sinks.tensorboard import finite_float
from trainspeed.telemetry import schema

QUIET_EVENTS = frozenset({"epoch", "run_start", "observation", "system", "peak_flops", "flops", "model",
                          "cuda", "collectives", "requeue"})
"""Event types not printed: routine markers the status line already covers, and records for the
report (what the doctor observed, the system sampler's series, the FLOP counts): a person reads
them in the report, not as raw dicts scrolling past the training."""

_MAX_VALUE = 80
"""A value longer than this (a path list, an argv) is left out of an event's line."""


def _short(value: Any) -> str | None:
    """A value as a person reads it on one line: floats to 4 significant digits; lists, dicts
    and long text (a sampler's series, an argv) left out."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple, dict, set)):
        return None
    text = str(value)
    return text if len(text) <= _MAX_VALUE else None


def event_line(event: dict[str, Any]) -> str | None:
    """The one console line of an event, or None for one a person does not need while it runs."""
    kind = event.get("type", "event")
    if kind in QUIET_EVENTS:
        return None
    data = event.get("data") or {}
    if isinstance(data, dict) and "message" in data:  # notes and warnings: the sentence itself
        details = str(data["message"])
    elif isinstance(data, dict):
        shown = ((k, _short(v)) for k, v in data.items())
        details = ", ".join(f"{k}={v}" for k, v in shown if v is not None)
    else:
        details = _short(data) or ""
    step = event.get("step")
    where = f" @ step {step}" if step is not None else ""
    own = data.get("ckpt_step") if isinstance(data, dict) else None
    if own is not None and own != step:
        # an async save is reported when its write ends: "checkpoint @ step 7: ... ckpt_step=4"
        # read as a checkpoint of step 7; and within a step the Monitor's count is the one before
        where = f" of step {own} (reported @ step {step})"
    return f"[trainspeed] {kind}{where}: {details}" if details else f"[trainspeed] {kind}{where}"

SHORT_PHASE = {
    "data": "data",
    "h2d": "h2d",
    "forward": "fwd",
    "backward": "bwd",
    "optimizer": "opt",
    "log": "log",
    "ckpt": "ckpt",
    "eval": "eval",
    "other": "other",
}
# Always shown (even at 0%) so the line keeps its shape; the rest only when >= 1%.
_CORE_PHASES = ("data", "forward", "backward", "optimizer")


class RecentWindow:
    """Sums over the last `size` step records (warm-up records excluded from rates)."""

    def __init__(self, size: int = 50) -> None:
        self._records: deque[dict[str, Any]] = deque(maxlen=size)
        self.last_step: int | None = None
        self.last_loss: float | None = None

    def add(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if isinstance(step, int):
            self.last_step = step
        loss = finite_float(record.get("loss"))
        if loss is not None:
            self.last_loss = loss
        if not record.get("warmup") and (finite_float(record.get("t_step")) or 0.0) > 0:
            self._records.append(record)

    def rates(self) -> tuple[float | None, float | None, float | None]:
        """(samples/s, tokens/s, mean step seconds) over the window; None when unknown."""
        if not self._records:
            return None, None, None
        total_t = sum(finite_float(r.get("t_step")) or 0.0 for r in self._records)
        if total_t <= 0:
            return None, None, None
        out: list[float | None] = []
        for key in ("samples", "tokens"):
            vals = [finite_float(r.get(key)) for r in self._records]
            out.append(sum(v for v in vals if v) / total_t if any(vals) else None)
        return out[0], out[1], total_t / len(self._records)

    def phase_shares(self) -> dict[str, float]:
        """Share of summed step time per phase over the window."""
        total_t = sum(finite_float(r.get("t_step")) or 0.0 for r in self._records)
        if total_t <= 0:
            return {}
        sums = dict.fromkeys(schema.PHASES, 0.0)
        for r in self._records:
            phases = r.get("phases") or {}
            for name in schema.PHASES:
                sums[name] += finite_float(phases.get(name)) or 0.0
        return {name: s / total_t for name, s in sums.items()}


def human_rate(x: float) -> str:
    """1234 -> '1,234', 56700 -> '56.7k', 3.2e6 -> '3.2M', 0.5 -> '0.50'."""
    if x >= 1e6:
        return f"{x / 1e6:.1f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    if x >= 10:
        return f"{x:,.0f}"
    return f"{x:.2f}"


def human_duration(seconds: float) -> str:
    """83 -> '1m23s', 3725 -> '1h02m', 9 -> '9s'."""
    s = int(round(max(seconds, 0.0)))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def format_status(window: RecentWindow, total_steps: int | None = None) -> str:
    """The status line for the current window (pure: no I/O)."""
    parts: list[str] = []
    step = window.last_step
    head = "step " + ("?" if step is None else str(step))
    if total_steps:
        head += f"/{total_steps}"
    if window.last_loss is not None:
        head += f" loss {window.last_loss:.4f}"
    parts.append(head)
    samples_s, tokens_s, mean_t = window.rates()
    rates = []
    if samples_s is not None:
        rates.append(f"{human_rate(samples_s)} samples/s")
    if tokens_s is not None:
        rates.append(f"{human_rate(tokens_s)} tok/s")
    if rates:
        parts.append(" ".join(rates))
    shares = window.phase_shares()
    if shares:
        shown = [
            f"{SHORT_PHASE[n]} {shares[n] * 100:.0f}%"
            for n in schema.PHASES
            if n in _CORE_PHASES or shares[n] >= 0.01
        ]
        parts.append(" ".join(shown))
    if total_steps and step is not None and mean_t is not None:
        parts.append(f"ETA {human_duration((total_steps - step) * mean_t)}")
    return " | ".join(parts)


class ConsoleSink:
    """Live status line (rich on a TTY, throttled plain lines otherwise) plus event lines."""

    name = "console"
    thinnable = True  # a dashboard: every k-th record when the writer is behind

    def __init__(
        self,
        *,
        total_steps: int | None = None,
        every_s: float = 1.0,
        stream: TextIO | None = None,
        window: int = 50,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total_steps is not None and (not isinstance(total_steps, int) or total_steps < 0):
            raise ConfigError(f"ConsoleSink total_steps must be an int >= 0, got {total_steps!r}")
        if not isinstance(every_s, (int, float)) or every_s < 0:
            raise ConfigError(f"ConsoleSink every_s must be a number >= 0, got {every_s!r}")
        self.total_steps = total_steps
        self.every_s = float(every_s)
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.window = RecentWindow(window)
        self._clock = clock
        self._last_print = -math.inf
        self._unprinted = False
        self._live: Any = None
        self._last_line: str | None = None
        self._closed = False
        try:
            self.tty = bool(self.stream.isatty())
        except (AttributeError, ValueError):
            self.tty = False

    # A live line on a TTY can refresh more often than plain log lines without spamming.
    @property
    def _interval(self) -> float:
        return min(self.every_s, 0.25) if self.tty else self.every_s

    def write_steps(self, records: list[dict[str, Any]]) -> None:
        if self._closed:
            return
        for record in records:
            self.window.add(record)
        self._unprinted = True
        now = self._clock()
        if now - self._last_print >= self._interval:
            self._show(format_status(self.window, self.total_steps))
            self._last_print = now
            self._unprinted = False

    def write_event(self, event: dict[str, Any]) -> None:
        line = None if self._closed else event_line(event)
        if line is None:
            return
        if self._live is not None:
            self._live.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=self.stream)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except (AttributeError, ValueError, OSError):
            pass

    def close(self) -> None:
        if self._closed:
            return
        if self._unprinted:
            self._show(format_status(self.window, self.total_steps))
            self._unprinted = False
        if self._live is not None:
            self._live.stop()
            self._live = None
        self._closed = True
        self.flush()

    def _show(self, line: str) -> None:
        if not self.tty:
            if line != self._last_line:  # the same status again (no step since): one line, not two
                print(line, file=self.stream)
                self._last_line = line
            return
        from rich.text import Text

        if self._live is None:
            from rich.live import Live

            from trainspeed.rich_console import new_console

            # auto_refresh=False: no extra rich thread; we redraw from the writer thread.
            # No stdout/stderr redirection: swapping sys.stdout from a background thread
            # under the user's training code is a global side effect we do not want.
            console = new_console(file=self.stream)
            self._live = Live(
                console=console,
                auto_refresh=False,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()
        self._live.update(Text(line), refresh=True)
