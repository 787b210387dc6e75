from __future__ import annotations

import json
import re

import pytest

from trainspeed.errors import MissingDependencyError
from trainspeed.report.html import write_html
from trainspeed.report.load import load_run
from trainspeed.report.plots import PLOTS

pytestmark = pytest.mark.timeout(120)
pytest.importorskip("matplotlib")

PLOT_NAMES = [name for name, _, _ in PLOTS]


def figures(text: str) -> dict[str, str]:
    return dict(re.findall(r'<figure class="plot" data-plot="(\w+)">(.*?)</figure>', text, flags=re.S))


def assert_self_contained(text: str) -> None:
    low = text.lower()
    assert "<script" not in low
    assert " src=" not in low
    assert "@import" not in low and "url(http" not in low
    # Only data: links; namespace URIs in the SVG (xmlns) are identifiers, not fetched.
    assert all(re.search(r"href=[\"']data:", tag) for tag in re.findall(r"<link[^>]*>", low))
    assert re.findall(r'(?<!xmlns=")(?<!xmlns:xlink=")https?://', low) == []


def test_single_run_page(run_a, tmp_path):
    lr = load_run(run_a)
    out = write_html(lr.run, tmp_path / "r.html", summary=lr.summary, findings=lr.findings)
    text = out.read_text()
    assert_self_contained(text)
    figs = figures(text)
    assert list(figs) == PLOT_NAMES
    for name in ("step_time", "phases", "throughput", "memory", "loss", "padding"):
        assert "<svg" in figs[name] and figs[name].count("<path") > 5, name
    # Findings in ranked order, with evidence; config and env in <details>.
    assert text.index("Training waits for data") < text.index("Padding waste") < text.index("Logging takes time")
    assert "data phase is 61% of step time" in text
    import html

    import yaml

    assert "<summary>Config of baseline (config.yaml)</summary>" in text and lr.run.config
    assert html.escape(yaml.safe_dump(lr.run.config, sort_keys=False)) in text
    assert "<summary>Environment of baseline (env.json)</summary>" in text
    # SVG ids are unique across the page (several inline SVGs share one id namespace).
    ids = re.findall(r'\bid="([^"]+)"', text)
    assert len(ids) == len(set(ids))


def test_no_data_note_instead_of_empty_axes(tmp_path):
    from report_synth import step_records, write_run

    records = step_records(50, slowdown_at=None, cuda=False)
    for r in records:
        r["loss"] = None
        r.pop("pad_share")
    lr = load_run(write_run(tmp_path / "noloss", records, device="cpu"))
    text = write_html(lr.run, tmp_path / "r.html", summary=lr.summary, findings=[]).read_text()
    figs = figures(text)
    assert "no data" in figs["loss"] and "<svg" not in figs["loss"]
    assert "no data" in figs["padding"] and "<svg" not in figs["padding"]
    assert "<svg" in figs["step_time"] and "<svg" in figs["memory"]
    assert "No findings." in text


def test_trend_marked_on_step_time(tmp_path):
    from report_synth import step_records, write_run

    summary_trend = {"slope_per_1000": 0.4, "since_step": 250, "phase": "data",
                     "message": "data time grows since step 250"}
    records = step_records(400, slowdown_at=250)
    run_dir = write_run(tmp_path / "slow", records)
    lr = load_run(run_dir)
    summary = dict(lr.summary, trend=summary_trend)
    text = write_html(lr.run, tmp_path / "r.html", summary=summary, findings=[]).read_text()
    step_fig = figures(text)["step_time"]
    # matplotlib writes each text label as an SVG comment next to its glyphs.
    assert "<!-- change point (step 250) -->" in step_fig
    assert "<!-- data trend -->" in step_fig
    assert "data time grows since step 250" in text


def test_long_run_svg_stays_small(tmp_path):
    from report_synth import step_records, write_run

    lr = load_run(write_run(tmp_path / "long", step_records(2500, slowdown_at=None)))
    text = write_html(lr.run, tmp_path / "r.html", summary=lr.summary, findings=[]).read_text()
    assert len(text) < 3_000_000  # binned, not 2500 vertices per line per plot
    assert list(figures(text)) == PLOT_NAMES


def test_compare_page_overlays_both_runs(run_a, run_b, tmp_path):
    a, b = load_run(run_a), load_run(run_b)
    text = write_html(a.run, tmp_path / "c.html", summary=a.summary, findings=a.findings, compare=b).read_text()
    assert_self_contained(text)
    figs = figures(text)
    assert list(figs) == PLOT_NAMES
    for name in ("step_time", "throughput", "loss"):
        assert f"<!-- A: {a.name}" in figs[name] and f"<!-- B: {b.name}" in figs[name], name
    assert "id='compare-table'" in text
    ratio = b.summary["samples_per_s"] / a.summary["samples_per_s"]
    assert f"<td class='num'>{ratio:.2f}</td>" in text
    assert f"Findings for A: {a.name}" in text and f"Findings for B: {b.name}" in text


def test_missing_summary_is_computed(run_a, tmp_path):
    import shutil

    copy = tmp_path / "nosummary"
    shutil.copytree(run_a, copy)
    report = json.loads((copy / "report.json").read_text())
    del report["summary"]
    (copy / "report.json").write_text(json.dumps(report))
    lr = load_run(copy)
    assert lr.summary_source == "computed from steps.jsonl"
    assert lr.summary["steps"] == load_run(run_a).summary["steps"]
    assert len(lr.findings) == 3
    (copy / "report.json").unlink()
    lr2 = load_run(copy)
    assert lr2.findings == [] and lr2.summary["steps"] == lr.summary["steps"]
    text = write_html(lr2.run, tmp_path / "r.html", summary=lr2.summary, findings=[]).read_text()
    assert list(figures(text)) == PLOT_NAMES


def test_without_matplotlib_terminal_still_works(run_a, tmp_path, monkeypatch, capsys):
    import io

    from rich.console import Console

    import trainspeed.report.plots as plots
    from trainspeed.report.render import render_run

    def missing(*args, **kwargs):
        raise MissingDependencyError("matplotlib", "report", "HTML reports")

    monkeypatch.setattr(plots, "require", missing)
    buf = io.StringIO()
    assert render_run(run_a, html=tmp_path / "x.html", console=Console(file=buf, width=120)) is None
    out = buf.getvalue()
    assert "Where the step time goes" in out
    assert "pip install 'trainspeed[report]'" in " ".join(out.split())
    assert not (tmp_path / "x.html").exists()


def test_step_time_plot_is_scaled_to_the_steady_steps(tmp_path):
    # A 2 s first step over ~25 ms steady steps set the y scale: the steady line sat flat at zero.
    from report_synth import step_records, write_run
    from trainspeed.report.plots import Series, steady_scale

    records = step_records(60, slowdown_at=None, cuda=False)
    records[0]["t_step"] = 2.0
    lr = load_run(write_run(tmp_path / "warm", records, device="cpu"))
    steady = max(r["t_step"] for r in records if not r["warmup"]) * 1e3
    top, (step, ms) = steady_scale([Series(label="a", run=lr.run, summary=lr.summary)])
    assert steady < top < 1.2 * steady and step == 0 and ms == pytest.approx(2000)
    text = write_html(lr.run, tmp_path / "r.html", summary=lr.summary, findings=[]).read_text()
    assert "warm-up step 0: 2,000 ms (off the scale)" in figures(text)["step_time"]
    # no warm-up spike: the scale is the data's own
    plain = load_run(write_run(tmp_path / "plain", step_records(60, slowdown_at=None, cuda=False), device="cpu"))
    assert steady_scale([Series(label="a", run=plain.run, summary=plain.summary)]) is None
