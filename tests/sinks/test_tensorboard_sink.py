from __future__ import annotations

from pathlib import Path

import pytest

from trainspeed.errors import ConfigError
from trainspeed.sinks.tensorboard import event_text, step_scalars
from trainspeed.telemetry import schema

pytestmark = pytest.mark.timeout(60)


def record(step: int) -> dict:
    phases = dict.fromkeys(schema.PHASES, 0.0)
    phases.update(data=0.01, forward=0.02, backward=0.05)
    return {
        "schema": 1, "step": step, "t_wall": 1000.0 + step, "t_step": 0.1, "phases": phases,
        "samples": 32, "tokens": 4096, "pad_share": 0.25, "loss": 3.0 - step * 0.5, "lr": 1e-3,
        "mem": {"rss": 64 * 2**20, "cuda_alloc_peak": None, "cuda_alloc_retries": 2},
        "syncs": 1, "warmup": False,
    }


def test_step_scalars_numbers() -> None:
    s = step_scalars(record(2))
    assert s["loss"] == 2.0 and s["lr"] == 1e-3 and s["pad_share"] == 0.25
    assert s["time/step_ms"] == pytest.approx(100.0)
    assert s["time/backward_ms"] == pytest.approx(50.0) and s["time/other_ms"] == 0.0
    assert s["throughput/samples_per_s"] == pytest.approx(320.0)
    assert s["throughput/tokens_per_s"] == pytest.approx(40960.0)
    assert s["memory/rss_mib"] == pytest.approx(64.0)
    assert s["memory/cuda_alloc_retries"] == 2.0
    assert "memory/cuda_alloc_peak_mib" not in s  # null values are omitted
    assert s["host_syncs"] == 1.0


def test_step_scalars_skip_missing_and_nonfinite() -> None:
    s = step_scalars({"step": 1, "loss": float("nan"), "t_step": 0.0, "samples": 8})
    assert s == {"time/step_ms": 0.0}  # no loss (NaN), no throughput (t_step 0)


def test_event_text() -> None:
    e = schema.make_event("checkpoint", 10, 0.0, path="a.pt", seconds=1.5)
    assert event_text(e) == "checkpoint @ step 10: path=a.pt, seconds=1.5"


def test_bad_every() -> None:
    pytest.importorskip("tensorboard")
    from trainspeed.sinks.tensorboard import TensorBoardSink

    with pytest.raises(ConfigError, match="every"):
        TensorBoardSink("x", every=0)


def test_files_read_back(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainspeed.sinks.tensorboard import TensorBoardSink

    sink = TensorBoardSink(tmp_path / "tb", every=2)
    sink.write_steps([record(i) for i in range(5)])
    sink.write_event(schema.make_event("checkpoint", 4, 1004.0, path="ck.pt"))
    sink.flush()
    sink.close()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("loss", "lr", "time/step_ms", "time/forward_ms", "time/data_ms",
                "throughput/samples_per_s", "throughput/tokens_per_s", "pad_share",
                "memory/rss_mib", "host_syncs"):
        assert tag in tags
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [0, 2, 4]  # every=2
    assert [e.value for e in loss] == pytest.approx([3.0, 2.0, 1.0])
    assert [e.wall_time for e in loss] == pytest.approx([1000.0, 1002.0, 1004.0])
    assert acc.Scalars("throughput/samples_per_s")[0].value == pytest.approx(320.0)
    # events are text summaries (stored as tensors by the PyTorch writer)
    assert "events/checkpoint/text_summary" in acc.Tags()["tensors"]
    (text_event,) = acc.Tensors("events/checkpoint/text_summary")
    assert text_event.step == 4
    assert b"checkpoint @ step 4: path=ck.pt" in text_event.tensor_proto.string_val[0]
