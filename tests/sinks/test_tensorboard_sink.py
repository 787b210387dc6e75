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
    # A note or warning that is only a sentence reads as that sentence, without "message=".
    assert event_text({"type": "warning", "step": 3, "data": {"message": "torch.compile failed"}}) == \
        "warning @ step 3: torch.compile failed"


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


def test_flatten_hparams() -> None:
    from trainspeed.sinks.hparams import flatten_hparams

    flat = flatten_hparams({"data": {"batch_size": 8, "shuffle": True, "sinks": ["jsonl"]},
                            "run": {"name": "r", "max_epochs": None, "lr": float("nan")}})
    assert flat == {"data.batch_size": 8.0, "data.shuffle": True, "data.sinks": "['jsonl']",
                    "run.name": "r", "run.max_epochs": "None", "run.lr": "nan"}


def test_final_metrics_exclude_warmup() -> None:
    from trainspeed.sinks.hparams import FinalMetrics

    finals = FinalMetrics()
    for i in range(4):
        finals.add({**record(i), "warmup": i == 0, "t_step": 1.0 if i == 0 else 0.1})
    m = finals.metrics()
    assert m["hparam/steps"] == 4 and m["hparam/final_loss"] == 1.5
    assert m["hparam/step_ms"] == pytest.approx(100.0)  # the 1 s warm-up step is excluded
    assert m["hparam/samples_per_s"] == pytest.approx(320.0)
    assert m["hparam/tokens_per_s"] == pytest.approx(40960.0)


def test_hparams_read_back(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from trainspeed.sinks.tensorboard import TensorBoardSink

    config = {"data": {"batch_size": 32, "dynamic_padding": False}, "precision": {"mode": "bf16-mixed"}}
    sink = TensorBoardSink(tmp_path / "tb", hparams=config)
    sink.write_steps([{**record(i), "warmup": i == 0} for i in range(3)])
    sink.close()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hp = start.session_start_info.hparams
    assert hp["data.batch_size"].number_value == 32
    assert hp["data.dynamic_padding"].bool_value is False
    assert hp["precision.mode"].string_value == "bf16-mixed"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    metric_tags = {m.name.tag for m in experiment.experiment.metric_infos}
    assert {"hparam/final_loss", "hparam/step_ms", "hparam/samples_per_s"} <= metric_tags
    assert acc.Scalars("hparam/final_loss")[0].value == pytest.approx(2.0)
    assert acc.Scalars("hparam/step_ms")[0].value == pytest.approx(100.0)


def test_monitor_passes_config_to_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainspeed.telemetry.monitor import Monitor

    mon = Monitor(tmp_path, sinks=("jsonl", "tensorboard"), system_sampler=False, warmup_steps=0,
                  config={"optim": {"lr": 0.01}})
    mon.step(samples=4, loss=0.5)
    mon.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams")
