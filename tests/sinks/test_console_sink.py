from __future__ import annotations

import io

import pytest

from trainspeed.errors import ConfigError
from trainspeed.sinks.console import (
    ConsoleSink,
    RecentWindow,
    format_status,
    human_duration,
    human_rate,
)
from trainspeed.telemetry import schema

pytestmark = pytest.mark.timeout(30)


def record(step: int, *, t: float = 0.1, warmup: bool = False, loss: float = 2.0) -> dict:
    phases = dict.fromkeys(schema.PHASES, 0.0)
    phases.update(data=0.012, forward=0.03, backward=0.045, optimizer=0.008, other=0.005)
    return {"step": step, "t_step": t, "phases": phases, "samples": 32, "tokens": 4096,
            "loss": loss, "warmup": warmup}


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_human_formats() -> None:
    assert human_rate(1234) == "1,234" and human_rate(56700) == "56.7k"
    assert human_rate(3.2e6) == "3.2M" and human_rate(0.5) == "0.50"
    assert human_duration(83) == "1m23s" and human_duration(3725) == "1h02m"
    assert human_duration(9) == "9s"


def test_status_line_numbers() -> None:
    w = RecentWindow(size=10)
    w.add(record(0, t=5.0, warmup=True))  # warm-up: excluded from rates and shares
    for i in range(1, 11):
        w.add(record(i, loss=2.0 - i * 0.1))
    line = format_status(w, total_steps=100)
    assert line == (
        "step 10/100 loss 1.0000 | 320 samples/s 41.0k tok/s"
        " | data 12% fwd 30% bwd 45% opt 8% other 5% | ETA 9s"
    )
    # ETA: 90 steps left * 0.1 s; phases under 1% (h2d, log, ckpt, eval) are hidden


def test_window_is_bounded_and_tracks_recent_speed() -> None:
    w = RecentWindow(size=4)
    for i in range(10):
        w.add(record(i, t=1.0))
    for i in range(10, 14):
        w.add(record(i, t=0.5))
    samples_s, tokens_s, mean_t = w.rates()
    assert samples_s == pytest.approx(64.0) and mean_t == pytest.approx(0.5)


def test_status_without_totals_or_throughput() -> None:
    w = RecentWindow()
    w.add({"step": 3, "loss": None})
    assert format_status(w) == "step 3"


def test_plain_stream_is_throttled() -> None:
    out, clock = io.StringIO(), FakeClock()
    sink = ConsoleSink(total_steps=50, every_s=1.0, stream=out, clock=clock)
    assert sink.tty is False
    for i in range(30):  # 30 steps within 0.29 s: one line only
        clock.t = i * 0.01
        sink.write_steps([record(i)])
    assert out.getvalue().count("\n") == 1 and out.getvalue().startswith("step 0/50")
    clock.t = 1.5
    sink.write_steps([record(30)])
    assert out.getvalue().count("\n") == 2 and "step 30/50" in out.getvalue()
    sink.write_steps([record(31)])  # throttled...
    sink.close()  # ...but the final state is printed on close
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("step 31/50")
    sink.write_steps([record(32)])  # after close: ignored
    assert len(out.getvalue().splitlines()) == 3


def test_events_print_one_line_each() -> None:
    out = io.StringIO()
    sink = ConsoleSink(stream=out, every_s=1e9)
    sink.write_event(schema.make_event("checkpoint", 100, 0.0, path="ck.pt", seconds=0.5))
    sink.write_event(schema.make_event("anomaly", 101, 0.0, kind="nan_loss"))
    # an async save reported when its write ends names the step it holds first
    sink.write_event(schema.make_event("checkpoint", 7, 0.0, kind="save", ckpt_step=4))
    sink.write_event(schema.make_event("checkpoint", 8, 0.0, kind="save", ckpt_step=8))
    sink.close()
    assert out.getvalue().splitlines() == [
        "[trainspeed] checkpoint @ step 100: path=ck.pt, seconds=0.5",
        "[trainspeed] anomaly @ step 101: kind=nan_loss",
        "[trainspeed] checkpoint of step 4 (reported @ step 7): kind=save, ckpt_step=4",
        "[trainspeed] checkpoint @ step 8: kind=save, ckpt_step=8",
    ]


def test_tty_uses_a_live_line() -> None:
    class TtyIO(io.StringIO):
        def isatty(self) -> bool:
            return True

    out, clock = TtyIO(), FakeClock()
    sink = ConsoleSink(total_steps=10, stream=out, clock=clock)
    sink.write_steps([record(1)])
    clock.t = 1.0
    sink.write_steps([record(2)])
    sink.write_event(schema.make_event("eval", 2, 0.0, val_loss=1.5))
    sink.close()
    text = out.getvalue()
    assert sink.tty and "step 2/10" in text and "eval @ step 2: val_loss=1.5" in text
    assert "\x1b[" in text  # cursor control: the line is redrawn, not appended


@pytest.mark.parametrize("kw", [{"every_s": -1}, {"total_steps": -5}, {"total_steps": 1.5}])
def test_bad_arguments(kw) -> None:
    with pytest.raises(ConfigError):
        ConsoleSink(**kw)


def test_events_a_person_needs_one_short_line_each_no_raw_series() -> None:
    # A real `trainspeed train gpt` printed the run_start dict with the whole argv, one line per
    # doctor observation, and the system sampler's summary with its series lists.
    out = io.StringIO()
    sink = ConsoleSink(stream=out, every_s=1e9)
    sink.write_event(schema.make_event("run_start", 0, 0.0, kind="train", argv=["python", "-m", "x"] * 20))
    sink.write_event(schema.make_event("observation", 0, 0.0, kind="dataloader", num_workers=0))
    sink.write_event(schema.make_event("system", 30, 0.0, samples=12, cpu_process_mean=27.275000000000002,
                                       series={"cpu": [1.0] * 500}, t=[0.5] * 500))
    sink.write_event(schema.make_event("peak_flops", 0, 0.0, flops=1.9e11))
    sink.write_event(schema.make_event("eval", 30, 0.0, seconds=0.6661935879999987, val_loss=4.819080352783203,
                                       per_batch=[4.8] * 50))
    sink.write_event(schema.make_event("warning", 31, 0.0, message="torch.compile failed", detail="x" * 500))
    sink.close()
    assert out.getvalue().splitlines() == [
        "[trainspeed] eval @ step 30: seconds=0.6662, val_loss=4.819",
        "[trainspeed] warning @ step 31: torch.compile failed",
    ]


def test_no_duplicated_status_lines() -> None:
    out, clock = io.StringIO(), FakeClock()
    sink = ConsoleSink(total_steps=50, stream=out, every_s=1.0, clock=clock)
    sink.write_steps([record(30)])
    clock.t = 2.0
    sink.write_steps([])  # a flush with no new step: the same line again
    sink.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == len(set(lines)) == 1
