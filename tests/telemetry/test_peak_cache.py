"""The measured peak (MFU's yardstick) is timed once per machine and reused: cache hit, miss,
a new key for a changed machine/torch/threads/dtype, re-measure on request, env.json notes."""

from __future__ import annotations

import json

import pytest
import torch

from trainspeed.telemetry import peaks
from trainspeed.telemetry.monitor import Monitor
from trainspeed.telemetry.peak_cache import CACHE_FILE, REMEASURE_ENV, cache_dir, cached_measurement, machine_key

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(REMEASURE_ENV, raising=False)
    peaks._measured.cache_clear()  # the per-process memo in front of the disk cache
    yield tmp_path / "xdg" / "trainspeed" / CACHE_FILE
    peaks._measured.cache_clear()


class Timer:
    """A stand-in matmul timing: returns the next figure, counts calls."""

    def __init__(self, *figures: float) -> None:
        self.figures, self.calls = list(figures), 0

    def __call__(self) -> float:
        self.calls += 1
        return self.figures.pop(0)


KEY = {"device": "cpu", "dtype": "fp32", "torch": "2.5.0", "name": "Xeon", "cores": 2, "threads": 2}


def test_cache_dir_respects_xdg(tmp_path, monkeypatch):
    assert cache_dir() == tmp_path / "xdg" / "trainspeed"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "trainspeed"


def test_miss_then_hit(cache):
    timer = Timer(200e9, 220e9)
    flops, cached, when = cached_measurement(KEY, timer)
    assert (flops, cached, timer.calls) == (200e9, False, 1) and when > 0
    again, cached2, when2 = cached_measurement(dict(KEY), timer)
    assert (again, cached2, when2, timer.calls) == (200e9, True, when, 1)  # no second timing
    stored = json.loads(cache.read_text())
    assert stored["schema"] == 1 and [e["key"] for e in stored["peaks"].values()] == [KEY]


@pytest.mark.parametrize("change", [{"torch": "2.6.0"}, {"threads": 1}, {"cores": 8}, {"dtype": "bf16"},
                                    {"name": "EPYC"}])
def test_a_changed_key_is_measured_anew_and_both_kept(cache, change):
    timer = Timer(200e9, 50e9)
    cached_measurement(KEY, timer)
    flops, cached, _ = cached_measurement({**KEY, **change}, timer)
    assert (flops, cached, timer.calls) == (50e9, False, 2)
    assert cached_measurement(KEY, timer)[:2] == (200e9, True)  # the first key still holds its figure
    assert len(json.loads(cache.read_text())["peaks"]) == 2


def test_remeasure_env_replaces_the_figure(cache, monkeypatch):
    timer = Timer(200e9, 210e9)
    cached_measurement(KEY, timer)
    monkeypatch.setenv(REMEASURE_ENV, "1")
    assert cached_measurement(KEY, timer)[:2] == (210e9, False)
    monkeypatch.delenv(REMEASURE_ENV)
    assert cached_measurement(KEY, timer)[:2] == (210e9, True) and timer.calls == 2


def test_an_unreadable_cache_is_measured_and_rewritten(cache):
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    assert cached_measurement(KEY, Timer(123e9))[:2] == (123e9, False)
    assert json.loads(cache.read_text())["schema"] == 1


def test_machine_key_names_what_the_figure_depends_on():
    key = machine_key("cpu", "fp32")
    assert key["device"] == "cpu" and key["dtype"] == "fp32" and key["torch"] == torch.__version__
    assert key["threads"] == torch.get_num_threads() and key["cores"] >= 1 and key["name"]
    before = torch.get_num_threads()
    torch.set_num_threads(1 if before != 1 else 2)
    try:
        assert machine_key("cpu", "fp32") != key
    finally:
        torch.set_num_threads(before)


def test_peak_for_times_once_per_machine(monkeypatch):
    timings = Timer(150e9, 999e9)
    monkeypatch.setattr(peaks, "_time_matmul", lambda dev, dtype: timings())
    first = peaks.peak_for("cpu", "fp32")
    assert first.source == "measured" and first.flops == 150e9 and not first.cached
    peaks._measured.cache_clear()  # a new process
    second = peaks.peak_for("cpu", "fp32")
    assert second.flops == 150e9 and second.cached and second.measured_at == first.measured_at
    assert timings.calls == 1
    assert second.as_dict() == {"name": second.name, "dtype": "fp32", "flops": 150e9, "source": "measured",
                                "cached": True, "measured_at": first.measured_at}


def test_a_run_records_the_cached_peak_in_env_json(tmp_path, monkeypatch):
    monkeypatch.setattr(peaks, "_time_matmul", lambda dev, dtype: 180e9)
    peaks.peak_for("cpu", "fp32")  # an earlier run filled the cache
    peaks._measured.cache_clear()
    mon = Monitor(tmp_path / "run", system_sampler=False)
    peaks.record_peak(mon, "cpu", "fp32")
    mon.close()
    env = json.loads((tmp_path / "run" / "env.json").read_text())
    assert env["peak_flops"]["flops"] == 180e9 and env["peak_flops"]["cached"] is True
    assert env["peak_flops"]["measured_at"] > 0 and env["torch"] == torch.__version__  # the rest kept
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    (event,) = [e for e in events if e["type"] == "peak_flops"]
    assert event["data"]["cached"] is True


def test_datasheet_peaks_carry_no_cache_fields():
    peak = peaks.lookup_peak("NVIDIA H100 80GB HBM3", "bf16")
    assert set(peak.as_dict()) == {"name", "dtype", "flops", "source"}


def test_env_cli_says_where_the_peak_came_from(monkeypatch, capsys):
    from trainspeed.cli.main import main

    monkeypatch.setattr(peaks, "_time_matmul", lambda dev, dtype: 190e9)
    assert main(["env", "--measure-peak"]) == 0
    first = " ".join(capsys.readouterr().out.split())
    assert "timed now, cached" in first and f"{REMEASURE_ENV}=1 measures again" in first
    peaks._measured.cache_clear()
    assert main(["env", "--measure-peak"]) == 0
    assert "from the cache" in " ".join(capsys.readouterr().out.split())
