"""The tune table's cells, Markdown and HTML, from a synthetic result."""

from __future__ import annotations

import math

from trainspeed.tune import stats
from trainspeed.tune.result import Row, TuneResult
from trainspeed.tune.table import cells, markdown, write_html


def result():
    fast = Row(knob="precision", setting="bf16-mixed", verdict=stats.FASTER, speedup=2.0,
               ci=(1.9, 2.1), memory_ratio=0.8, loss_delta=0.001)
    nan = Row(knob="precision", setting="fp16-mixed", verdict=stats.LOSS_MISMATCH, speedup=1.5,
              ci=(1.4, 1.6), loss_delta=math.inf, note="loss inf vs baseline 2.0\nmore")
    skip = Row(knob="precision", setting="tf32", note="TF32 needs a GPU")
    final = Row(knob="combined", setting="precision.mode=bf16-mixed", verdict=stats.FASTER,
                speedup=1.98, ci=(1.9, 2.05))
    return TuneResult(ablation=[fast, nan, skip], combination=[fast], best_settings={"precision.mode": "bf16-mixed"},
                      final=final, baseline_cost_s=0.01, trials_run=7, trials_reused=0, elapsed_s=70.0,
                      notes=["a note <b>"], baseline_mfu=0.623, peak_name="cpu (2 threads) fp32 (measured)")


def test_cells_format_speedup_memory_loss_and_first_note_line():
    fast, nan, skip = result().ablation
    assert cells(fast) == ["precision", "bf16-mixed", "—", "2.00x", "1.90–2.10", "—", "-20%", "+0.1%", "faster", ""]
    assert cells(nan)[7:] == ["non-finite", "loss mismatch", "loss inf vs baseline 2.0"]
    assert cells(skip)[2:9] == ["—", "—", "—", "—", "—", "—", "skipped"]


def test_the_doctors_stake_and_a_one_time_cost_have_their_own_columns():
    """The doctor's predicted share beside the measured gain; compile's warm-up apart from its
    per-step speed (it was a clause at the end of the note)."""
    row = Row(knob="compile", setting="default", verdict=stats.FASTER, speedup=1.3, ci=(1.2, 1.4),
              stake=0.4, one_time=(31.6, 1500))
    assert cells(row)[2:6] == ["40%", "1.30x", "1.20–1.40", "+32 s, pays off after 1,500 steps"]
    assert cells(Row(knob="compile", setting="default", one_time=(31.6, None)))[5] == "+32 s, never pays off"


def test_markdown_and_html_hold_every_table(tmp_path):
    md = markdown(result())
    assert md.count("| knob |") == 3 and "| precision | bf16-mixed | — | 2.00x |" in md
    html = write_html(result(), tmp_path / "tune.html", title="t", subtitle="s").read_text()
    assert "id='ablation'" in html and "id='combination'" in html and "id='final'" in html
    assert "a note &lt;b&gt;" in html  # escaped
    assert "precision.mode=bf16-mixed" in html
    # The baseline's cost per sample and MFU head the tables.
    line = "baseline: 10.000 ms/sample, MFU 62 % of cpu (2 threads) fp32 (measured)"
    assert md.startswith(line) and line in html


def test_tune_json_round_trips_to_the_same_markdown():
    import json

    from trainspeed.tune.table import result_from_json

    original = result()
    data = json.loads(json.dumps(original.as_dict(), default=str))
    assert markdown(result_from_json(data)) == markdown(original)


def test_a_long_verified_combination_wraps_instead_of_squeezing_the_numbers():
    from rich.console import Console

    from trainspeed.tune.table import print_tables

    res = result()
    res.final = Row(knob="combined", verdict=stats.FASTER, speedup=1.48, ci=(1.44, 1.53), loss_delta=-0.029,
                    setting="data.num_workers=1, data.persistent_workers=True, data.prefetch_factor=4, "
                            "logging.every=50, optim.implementation=fused, run.torch_threads=1")
    con = Console(width=120, record=True, force_terminal=False)
    print_tables(res, console=con)
    text = con.export_text()
    verified = text[text.index("Verified"):]
    assert "1.48x" in verified and "1.44–1.53" in verified and "faster" in verified
    assert "torch_threads" in verified  # wrapped, not cut
