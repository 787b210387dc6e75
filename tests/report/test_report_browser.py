"""The HTML reports in a real browser: headless Chromium over the DevTools Protocol.

Skips when Chromium or websocket-client is missing locally; CI installs both.
"""

from __future__ import annotations

import struct

import pytest

from report_browser import find_chromium, load_page

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(find_chromium() is None, reason="chromium not installed (apt-get install chromium)"),
]
pytest.importorskip("websocket", reason="websocket-client not installed")
pytest.importorskip("matplotlib")

# Per figure: its name, whether it has an <svg>, how many drawn marks it holds, a no-data note,
# and its rendered size (a zero-size SVG would pass a DOM count but show nothing).
SCRIPT = """(() => [...document.querySelectorAll('figure.plot')].map(f => {
  const svg = f.querySelector('svg');
  const r = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  return {name: f.dataset.plot, svg: !!svg, w: r.width, h: r.height,
          marks: svg ? svg.querySelectorAll('path, line, polyline, use, rect').length : 0,
          nodata: !!f.querySelector('.nodata')};
}))()"""

PLOTS = ["step_time", "phases", "throughput", "memory", "loss", "padding"]


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def check_page(html_path, tmp_path, name):
    shot = tmp_path / f"{name}.png"
    result = load_page(html_path, script=SCRIPT, screenshot=shot, user_data_dir=tmp_path / f"chrome-{name}")
    assert result.errors == []
    # Offline: the only request is the page itself.
    assert result.requests == [html_path.resolve().as_uri()]
    figs = {f["name"]: f for f in result.value}
    assert list(figs) == PLOTS
    for plot, f in figs.items():
        assert f["svg"] and not f["nodata"], plot
        assert f["marks"] > 10, plot
        assert f["w"] > 300 and f["h"] > 100, plot
    assert shot.stat().st_size > 20_000
    width, height = png_size(shot)
    assert width == 1280 and height >= 2000
    return shot


def test_single_report_in_browser(run_a, tmp_path):
    from trainspeed.report.render import render_run

    path = render_run(run_a, html=tmp_path / "report.html", terminal=False, console=_quiet())
    check_page(path, tmp_path, "single")


def test_compare_report_in_browser(run_a, run_b, tmp_path):
    from trainspeed.report.render import render_compare

    path = render_compare(run_a, run_b, html=tmp_path / "compare.html", terminal=False, console=_quiet())
    check_page(path, tmp_path, "compare")


def _quiet():
    import io

    from rich.console import Console

    return Console(file=io.StringIO())


def test_checker_sees_errors_and_requests(tmp_path):
    """The harness itself: a broken page must fail the checks above (else they prove nothing)."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><img src='missing.png'>"
                    "<script>console.error('boom'); undefined_fn();</script></body></html>")
    result = load_page(page, script="document.querySelectorAll('figure.plot').length",
                       screenshot=tmp_path / "b.png", user_data_dir=tmp_path / "chrome-b")
    assert result.value == 0
    assert any("boom" in e for e in result.errors)
    assert any("undefined_fn" in e for e in result.errors)
    assert any(r.endswith("/missing.png") for r in result.requests)
