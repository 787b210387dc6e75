"""The report links a run's profiler trace: the path in the terminal, a relative link in HTML."""

from __future__ import annotations

import io

import pytest
import torch

from trainspeed.report.traces import profile_traces
from trainspeed.telemetry import read_run
from trainspeed.telemetry.monitor import Monitor

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def profiled_run(tmp_path):
    run_dir = tmp_path / "run"
    mon = Monitor(run_dir, log_every=5, system_sampler=False, warmup_steps=0, profile_steps="2-3")
    w = torch.randn(4, 4, requires_grad=True)
    for _ in range(4):
        with mon.phase("forward"):
            loss = (w @ w).sum()
        with mon.phase("backward"):
            loss.backward()
        mon.step(samples=4, loss=loss)
    mon.close()
    return run_dir


def test_profile_traces_from_events(profiled_run):
    (trace,) = profile_traces(read_run(profiled_run))
    assert trace.path == profiled_run / "profile_steps_2-3.json" and trace.exists
    assert trace.steps == "2-3"
    assert trace.href(profiled_run) == "profile_steps_2-3.json"
    assert trace.href(profiled_run / "html") == "../profile_steps_2-3.json"


def test_terminal_prints_path_and_html_links_it(profiled_run):
    from rich.console import Console

    pytest.importorskip("matplotlib")
    from trainspeed.report import render_run

    buf = io.StringIO()
    html = render_run(profiled_run, console=Console(file=buf, width=60))
    assert f"Profiler trace of steps 2-3: {profiled_run / 'profile_steps_2-3.json'}" in buf.getvalue()
    page = html.read_text()
    assert "<section id='profile'>" in page
    assert "<a href='profile_steps_2-3.json'>profile_steps_2-3.json</a>" in page


def test_missing_trace_file_is_marked(profiled_run):
    (profiled_run / "profile_steps_2-3.json").unlink()
    (trace,) = profile_traces(read_run(profiled_run))
    assert not trace.exists


def test_no_profile_event_no_section(tmp_path):
    mon = Monitor(tmp_path, log_every=5, system_sampler=False)
    mon.step(samples=1)
    mon.close()
    assert profile_traces(read_run(tmp_path)) == []
