"""The pages' templates: escaping on by default, Markup only where a value is HTML on purpose,
and the templates ship in the wheel (a non-editable install finds them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from markupsafe import Markup

from trainspeed.report.templating import environment

ROOT = Path(__file__).resolve().parents[2]


def test_every_value_is_escaped_unless_it_is_markup():
    page = environment().from_string("<p title='{{ a }}'>{{ a }}{{ svg }}</p>")
    text = page.render(a="<script>x('&\"')</script>", svg=Markup("<svg><g/></svg>"))
    assert text == ("<p title='&lt;script&gt;x(&#x27;&amp;&quot;&#x27;)&lt;/script&gt;'>"
                    "&lt;script&gt;x(&#x27;&amp;&quot;&#x27;)&lt;/script&gt;<svg><g/></svg></p>")
    assert environment().autoescape is True


def test_layout_line_breaks_are_dropped_from_html_templates_only():
    env = environment()
    source = "<ul>\n  <li>{{ a }}</li>\n</ul>{{ '\\n' }}"
    assert env.preprocess(source, "x.html.j2") == "<ul><li>{{ a }}</li></ul>{{ '\\n' }}"
    assert env.preprocess("a {\n  b: 1;\n}\n", "report.css") == "a {\n  b: 1;\n}\n"


@pytest.mark.timeout(240)
def test_a_wheel_install_renders_the_pages(tmp_path):
    """`pip install .` (not editable) must carry report/templates/: package data in pyproject."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                   check=True, capture_output=True, timeout=200)
    wheel = next((tmp_path / "dist").glob("trainspeed-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for template in (ROOT / "src/trainspeed/report/templates").iterdir():
        assert f"trainspeed/report/templates/{template.name}" in names
    site = tmp_path / "site"
    subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)], check=True,
                   capture_output=True, timeout=120)
    script = ("import trainspeed, sys; from trainspeed.tune.result import TuneResult; "
              "from trainspeed.tune.table import write_html; "
              "assert trainspeed.__file__.startswith(sys.argv[1]), trainspeed.__file__; "
              "r = TuneResult(ablation=[], combination=[], best_settings={}, final=None, baseline_cost_s=0.01, "
              "trials_run=1, trials_reused=0, elapsed_s=1.0, notes=['<b>']); "
              "print(write_html(r, sys.argv[2], title='t', subtitle='s').read_text())")
    out = subprocess.run([sys.executable, "-c", script, str(site), str(tmp_path / "tune.html")],
                         env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}, cwd=tmp_path,
                         check=True, capture_output=True, text=True, timeout=120).stdout
    assert "<section id='best'>" in out and "&lt;b&gt;" in out and out.startswith("<!DOCTYPE html>\n")
