from __future__ import annotations

import sys
from pathlib import Path

import pytest

from trainspeed.errors import ConfigError
from trainspeed.sinks import CsvSink, JsonlSink, NullSink, Sink, make_sinks
from trainspeed.sinks.console import ConsoleSink

pytestmark = pytest.mark.timeout(60)


def test_builds_named_sinks(tmp_path: Path) -> None:
    null = NullSink()
    sinks = make_sinks(tmp_path, ["jsonl", "CSV", "console", null, "jsonl"], total_steps=7)
    assert [type(s) for s in sinks] == [JsonlSink, CsvSink, ConsoleSink, NullSink]
    assert sinks[3] is null and sinks[2].total_steps == 7
    assert all(isinstance(s, Sink) for s in sinks)
    for s in sinks:
        s.close()


def test_tensorboard_goes_to_tb_dir(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    (sink,) = make_sinks(tmp_path, ["tb"], config={"logging": {"tb_every": 3}})
    assert sink.log_dir == tmp_path / "tb" and sink.every == 3
    sink.close()


def test_wandb_reads_config(monkeypatch, tmp_path: Path) -> None:
    import types

    calls = []
    mod = types.ModuleType("wandb")
    mod.init = lambda **kw: calls.append(kw) or types.SimpleNamespace(finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", mod)
    config = {"run": {"name": "r1"}, "logging": {"wandb_project": "proj", "wandb_mode": "offline"}}
    make_sinks(tmp_path, ["wandb"], config=config)
    assert calls == [{"project": "proj", "name": "r1", "mode": "offline", "config": config,
                      "dir": str(tmp_path)}]


@pytest.mark.parametrize("config_mode, env_mode, expected", [
    ("online", "offline", None),  # the environment beats the config's default: wandb reads WANDB_MODE
    ("offline", None, "offline"),
    ("disabled", "online", "disabled"),  # an explicit non-default config mode is kept
])
def test_wandb_mode_from_environment(monkeypatch, tmp_path: Path, config_mode, env_mode, expected) -> None:
    import types

    calls = []
    mod = types.ModuleType("wandb")
    mod.init = lambda **kw: calls.append(kw) or types.SimpleNamespace(finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", mod)
    if env_mode is None:
        monkeypatch.delenv("WANDB_MODE", raising=False)
    else:
        monkeypatch.setenv("WANDB_MODE", env_mode)
    make_sinks(tmp_path, ["wandb"], config={"logging": {"wandb_mode": config_mode}})
    assert calls[0].get("mode") == expected


def test_unknown_name_suggests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        make_sinks(tmp_path, ["jsonl", "tensorbord"])
    msg = str(info.value)
    assert "'tensorbord'" in msg and "Did you mean 'tensorboard'?" in msg
    assert "jsonl, csv, tensorboard, console, wandb" in msg
    assert not (tmp_path / "steps.jsonl").exists()  # validated before anything was built


def test_file_sinks_need_a_run_dir() -> None:
    with pytest.raises(ConfigError, match="run directory"):
        make_sinks(None, ["console", "jsonl"])
    (sink,) = make_sinks(None, ["console"])
    assert isinstance(sink, ConsoleSink)
