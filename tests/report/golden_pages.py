"""Pages with every section filled and hostile strings in every field a user controls (run
names, findings, config, traceback, trace names, tune knobs and notes), rendered with a fixed
clock and stub plots: the golden files in tests/report/golden/ were written by the
f-string pages before the templates (commit afb0291), and the template pages must equal them
byte for byte.

`python tests/report/golden_pages.py DIR` writes the three pages into DIR (to look at a diff).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

HOSTILE = "<script>alert(\"x&y\")</script> & 'q'"
NAME_A = "base<b>&\"q\"'"
NAME_B = "tuned&amp;<i>"
STUB_SVG = ("<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 10 10\"><!-- A: {label} -->"
            "<text x='1' y='5'>a &lt; b</text></svg>")
GOLDEN = Path(__file__).parent / "golden"
PAGES = ("doctor.html", "compare.html", "tune.html")


def _summary(scale: float, *, ranks: bool) -> dict:
    s = {
        "steps": 12, "measured_steps": 9, "samples_per_s": 1234.5 * scale, "tokens_per_s": 98765.0 * scale,
        "step_time": {"p50": 0.025 / scale, "p90": 0.031 / scale, "p99": 0.04 / scale},
        "mfu": {"value": 0.0123 * scale, "peak_name": "cpu <fp32>", "peak_flops": 1e12},
        "memory": {"rss_peak": 9.1e8, "worker_rss_peak": 3e8},
        "loss": {"first": 3.2, "last": 0.61, "min": 0.6}, "pad_share": 0.3, "syncs_per_step": 1.5,
        "trend": {"message": f"data time grows {HOSTILE}"}, "dropped_records": 2, "thinned_records": 3,
        "device": "cpu <&>", "precision": "fp32",
        "phases": {"data": {"mean_s": 0.004, "share": 0.16}, "forward": {"mean_s": 0.006, "share": 0.24},
                   "backward": {"mean_s": 0.011 / scale, "share": 0.44}, "optimizer": {"mean_s": 0.002,
                                                                                         "share": 1.4},
                   "log": {"mean_s": 0.0004, "share": None}},
    }
    if ranks:
        s["ranks"] = [{"rank": 0, "steps": 12, "step_time_p50": 0.025, "local_p50": 0.01, "data_wait_p50": 0.004,
                       "data_share": 0.16, "straggler": False},
                      {"rank": "1<&>", "steps": 12, "step_time_p50": 0.03, "local_p50": 0.02,
                       "data_wait_p50": 0.012, "data_share": 0.4, "straggler": True, "why": f"slow data {HOSTILE}"}]
    return s


FINDINGS = [
    {"id": "data\"bound'<x>", "severity": "critical", "title": f"Training waits {HOSTILE}",
     "evidence": "data phase is 61% <of> step & more", "recommendation": "set num_workers=4 && go",
     "verify_with": "trainspeed tune cfg.yaml --only data <&>", "impact": 0.61, "tuned": "tuned 'yes' & \"no\""},
    {"id": "odd", "severity": "<bogus>", "title": None, "evidence": "e", "impact": "n/a"},
    {"id": "pad", "severity": "warning", "title": "Padding waste", "evidence": "25% of tokens are padding",
     "recommendation": "bucket by length", "verify_with": None, "impact": 0.25},
]


def _write(run_dir: Path, *, scale: float, findings: list[dict], crashed: bool, ranks: bool) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    from report_synth import step_records, write_run

    write_run(run_dir, step_records(8, slowdown_at=None, cuda=False), summary=_summary(scale, ranks=ranks),
              findings=findings, extra_step_lines=["{not json <&>"], device="cpu")
    (run_dir / "config.yaml").write_text(yaml_text())
    with (run_dir / "events.jsonl").open("a") as f:
        f.write(json.dumps({"schema": 1, "type": "profile", "step": 3, "t_wall": 1.7e9,
                            "data": {"path": "/elsewhere/trace<&>'x'.json", "captured": [3, 5]}}) + "\n")
    (run_dir / "trace<&>'x'.json").write_text("{}")
    if crashed:
        report = json.loads((run_dir / "report.json").read_text())
        report.update(kind="doctor", traceback=f"Traceback:\n  File \"train.py\"\nValueError: {HOSTILE}\n")
        (run_dir / "report.json").write_text(json.dumps(report))
    return run_dir


def yaml_text() -> str:
    return f"model:\n  name: '{HOSTILE.replace(chr(39), chr(39) * 2)}'\nbatch_size: 32\n"


def _tune_result():
    from trainspeed.tune import stats
    from trainspeed.tune.result import Row, TuneResult

    fast = Row(knob="precision<&>", setting="bf16 \"mixed\" & 'x'", verdict=stats.FASTER, speedup=2.0,
               ci=(1.9, 2.1), noise=0.03, memory_ratio=0.8, loss_delta=0.001, stake=0.4, one_time=(31.6, 1500))
    nan = Row(knob="precision", setting="fp16-mixed", verdict=stats.LOSS_MISMATCH, speedup=1.5,
              ci=(1.4, 1.6), loss_delta=math.inf, note=f"loss inf {HOSTILE}\nmore")
    same = Row(knob="num_workers", setting="2", verdict=stats.NO_CHANGE, speedup=1.02, ci=(0.9, 1.2),
               noise=0.2, noise_from="rounds <&>", note="budget")
    slow = Row(knob="compile", setting="max-autotune", verdict=stats.SLOWER, speedup=0.8, ci=(0.7, 0.85))
    skip = Row(knob="precision", setting="tf32", note="TF32 needs a GPU")
    final = Row(knob="combined", setting="precision.mode=bf16-mixed", verdict=stats.FASTER, speedup=1.98,
                ci=(1.9, 2.05))
    return TuneResult(ablation=[fast, nan, same, slow, skip], combination=[fast],
                      best_settings={"precision.mode": "bf16<&>", "data.num_workers": 4}, final=final,
                      baseline_cost_s=0.01, trials_run=7, trials_reused=2, elapsed_s=70.4,
                      notes=[f"a note {HOSTILE}", "second"], baseline_mfu=0.623, peak_name="cpu <fp32>")


def render(out_dir: Path, work: Path) -> dict[str, str]:
    """The three pages' text, run paths shown as /runs/NAME; `work` holds the run directories."""
    import trainspeed.report.html as html_mod
    from trainspeed.report.load import load_run
    from trainspeed.tune.table import write_html as tune_html

    clock, plots = html_mod._generated, html_mod.render_plots

    def stub_plots(runs):
        # every plot: a stub SVG naming its runs, and one plot with no data
        return [(name, f"title {i} <&>", None if i == 1 else STUB_SVG.format(label=runs[0].label))
                for i, name in enumerate(("step_time", "phases", "throughput"))]

    html_mod._generated, html_mod.render_plots = (lambda: "2026-01-02 03:04 UTC"), stub_plots
    try:
        a = load_run(_write(work / NAME_A, scale=1.0, findings=FINDINGS, crashed=True, ranks=True))
        b = load_run(_write(work / NAME_B, scale=1.25, findings=[], crashed=False, ranks=False))
        b.summary_source = "computed from steps.jsonl"  # the note a run without report.json's summary gets
        html_mod.write_html(a.run, out_dir / "doctor.html", summary=a.summary, findings=a.findings)
        html_mod.write_html(a.run, out_dir / "compare.html", summary=a.summary, findings=a.findings, compare=b)
    finally:
        html_mod._generated, html_mod.render_plots = clock, plots
    tune_html(_tune_result(), out_dir / "tune.html", title=f"trainspeed tune: {HOSTILE}",
              subtitle="cfg<&>.yaml · 7 trials")
    return {name: (out_dir / name).read_text(encoding="utf-8").replace(str(work), "/runs") for name in PAGES}


if __name__ == "__main__":
    import tempfile

    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pages").mkdir()
        (Path(tmp) / "work").mkdir()
        for name, text in render(Path(tmp) / "pages", Path(tmp) / "work").items():
            (target / name).write_text(text, encoding="utf-8")
