"""The tune table's cells, Markdown and HTML, from a synthetic result."""

from __future__ import annotations

import math

import pytest

from trainspeed.tune import stats
from trainspeed.tune.result import Row, TuneResult
from trainspeed.tune.table import cells, markdown, write_html


def result():
    fast = Row(knob="precision", setting="bf16-mixed", verdict=stats.FASTER, speedup=2.0,
               ci=(1.9, 2.1), noise=0.03, memory_ratio=0.8, loss_delta=0.001)
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
    assert cells(fast) == ["precision", "bf16-mixed", "—", "2.00x", "1.90–2.10", "±3%", "—", "-20%", "+0.1%",
                           "faster", ""]
    assert cells(nan)[8:] == ["non-finite", "loss mismatch", "loss inf vs baseline 2.0"]
    assert cells(skip)[2:10] == ["—", "—", "—", "—", "—", "—", "—", "skipped"]


def test_a_no_change_row_shows_its_threshold_and_why():
    # seen: "num_workers=2 | 2.10x | 95 % CI 1.37-3.28 | no measurable change", the threshold only in tune.json
    row = Row(knob="num_workers", setting="2", verdict=stats.NO_CHANGE, speedup=2.10, ci=(1.37, 3.28),
              noise=1.15, noise_from=stats.NOISE_ROUNDS, note="2 of 3 repeats (budget)")
    c = cells(row)
    assert c[5] == "±115%" and c[9] == "no measurable change"
    assert c[10] == ("CI 1.37–3.28 reaches into the noise band 0.47–2.15x (this setting's rounds disagree "
                    "by that much); 2 of 3 repeats (budget)")


def test_the_verdict_is_read_off_the_ci_and_the_noise_band():
    def verdict(lo, hi, noise):
        c = stats.Comparison(speedup=(lo + hi) / 2, ci_low=lo, ci_high=hi, noise=noise,
                             reference_cost=1.0, candidate_cost=1.0)
        return stats.speed_verdict(c)

    assert verdict(1.19, 1.23, 0.10) == stats.FASTER  # wholly above 1.10
    assert verdict(1.19, 1.23, 0.25) == stats.NO_CHANGE  # tf32 1.21x (1.19-1.23) against a 25 % band
    assert verdict(1.37, 3.28, 0.30) == stats.FASTER
    assert verdict(1.08, 1.40, 0.10) == stats.NO_CHANGE  # the speedup clears 1.10, its interval does not
    assert verdict(0.85, 0.88, 0.10) == stats.SLOWER  # wholly below 1/1.1
    assert verdict(0.88, 0.93, 0.10) == stats.NO_CHANGE

def test_the_doctors_stake_and_a_one_time_cost_have_their_own_columns():
    """The doctor's predicted share beside the measured gain; compile's warm-up apart from its
    per-step speed (it was a clause at the end of the note)."""
    row = Row(knob="compile", setting="default", verdict=stats.FASTER, speedup=1.3, ci=(1.2, 1.4),
              stake=0.4, one_time=(31.6, 1500))
    assert cells(row)[2:7] == ["40%", "1.30x", "1.20–1.40", "—", "+32 s, pays off after 1,500 steps"]
    assert cells(Row(knob="compile", setting="default", one_time=(31.6, None)))[6] == "+32 s, never pays off"
    # dcgan's compile at 1.00x (CI 0.95-1.05) read "+4 s, pays off after 17,821 steps"
    flat = Row(knob="compile", setting="default", verdict=stats.NO_CHANGE, speedup=1.0002, ci=(0.95, 1.05),
               noise=0.1, one_time=(4.2, 17821))
    assert cells(flat)[6] == "+4 s, no measured gain pays it back"


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


def test_an_answer_the_budget_left_unverified_is_not_titled_verified(tmp_path):
    # reinforce.py's 3m tune: the budget left the verification unrun, the ablation's one-round
    # 1.32x was given as the answer (verify.ablation_answer), and its table read "Verified"
    import json

    from rich.console import Console

    from trainspeed.tune.table import print_tables, result_from_json, write_html

    res = result()
    res.final = Row(knob="combined", setting="--log-interval 100", verdict=stats.FASTER, speedup=1.32,
                    ci=(1.2, 1.4), unverified=True,
                    note="--log-interval=100 as measured against the baseline in the ablation: the budget ran out")
    con = Console(width=160, record=True, force_terminal=False)
    print_tables(res, console=con)
    text = " ".join(con.export_text().split())  # a title wider than the table folds
    title = "Answer: best config vs baseline, as measured in the ablation (not verified afresh)"
    assert title in text and "Verified" not in text
    assert title in markdown(res) and "Verified" not in markdown(res)
    again = result_from_json(json.loads(json.dumps(res.as_dict())))
    assert again.final.unverified and markdown(again) == markdown(res)
    page = write_html(res, tmp_path / "tune.html", title="t", subtitle="s").read_text()
    assert title in page and "Verified" not in page
    res.final.unverified = False  # verified afresh: titled so
    assert "Verified: best config vs baseline" in markdown(res)


def test_the_table_opens_with_the_baseline_mfu_or_says_it_is_unknown():
    res = result()
    assert markdown(res).startswith("baseline: 10.000 ms/sample, MFU 62 %")
    res.baseline_mfu = 0.0012  # makemore under load: not "0 %"
    assert markdown(res).startswith("baseline: 10.000 ms/sample, MFU 0.12 % of cpu")
    res.baseline_mfu = None
    assert markdown(res).startswith("baseline: 10.000 ms/sample, MFU unknown (no FLOP count")


def test_a_script_tune_from_a_doctor_run_reads_the_baseline_mfu_from_its_flop_count():
    # trials count no FLOPs (it would slow a step of each): the doctor run's count and peak,
    # at the baseline trials' median measured step, as the doctor computes MFU
    from trainspeed.patches.targets import Targets
    from trainspeed.tune.script_facts import ScriptFacts
    from trainspeed.tune.script_session import doctor_mfu
    from trainspeed.tune.trials import TrialResult

    facts = ScriptFacts(targets=Targets(), flops_per_step=2.7e9, peak=(4e10, "cpu (2 threads) fp32 (measured)"))
    base = [TrialResult(key="b", label="baseline", repeat=i, ok=True, step_times=[0.12, 0.135, 0.15]) for i in range(2)]
    assert doctor_mfu(facts, base) == (pytest.approx(0.5), "cpu (2 threads) fp32 (measured)")
    assert doctor_mfu(ScriptFacts(targets=Targets(), peak=(4e10, "x")), base) == (None, None)  # no FLOP count
    assert doctor_mfu(facts, []) == (None, None)
    impossible = ScriptFacts(targets=Targets(), flops_per_step=1e12, peak=(4e10, "x"))
    assert doctor_mfu(impossible, base) == (None, None)  # over 100 %: a wrong count, never shown


@pytest.mark.parametrize("columns", [None, "100", "80"])
def test_a_table_printed_to_a_log_fits_its_width_with_every_figure_and_note(capsys, monkeypatch, columns):
    """`trainspeed tune ... | tee log`: the tables printed 240 columns wide (garbage in a log
    viewer or a mail); at 160 the note was once left 10 characters, its right border cut off
    (nanoGPT's tune log). Now: $COLUMNS, else rich_console.PIPE_WIDTH; each note under its table."""
    from trainspeed.rich_console import PIPE_WIDTH
    from trainspeed.tune.table import print_tables

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    width = int(columns or PIPE_WIDTH)
    res = result()
    res.ablation.append(Row(knob="expandable_segments", setting="--eval_interval=120", verdict=stats.NO_CHANGE,
                            speedup=1.01, ci=(0.99, 1.03), noise=0.12, memory_ratio=1.0, one_time=(12.0, 1700),
                            loss_delta=0.0, note="the caching allocator's segments expand on CUDA only " * 2))
    print_tables(res)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width, [line for line in lines if len(line) > width]
    ablation = out[out.index("Ablation"):out.index("Greedy")]
    for figure in ("2.00x", "1.90–2.10", "1.01x", "0.99–1.03", "faster", "skipped"):
        assert figure in ablation, (figure, ablation)
    assert "loss mismatch" in " ".join(ablation.split())  # the verdict folds whole, it is not cut
    assert "[3] expandable_segments --eval_interval=120: CI 0.99–1.03" in ablation  # the note, under the table
    assert "segments expand on CUDA only" in " ".join(ablation.split())
    if width < 100:  # the least read figures give way, and it says so
        assert "(left out at 80 columns: one-time, memory;" in ablation


def test_a_wide_terminal_keeps_the_boxed_table_with_its_notes_in_it():
    from rich.console import Console

    from trainspeed.tune.table import print_tables

    con = Console(width=220, record=True, force_terminal=False)
    print_tables(result(), console=con)
    text = con.export_text()
    assert "┃ note" in text and "│ loss inf vs baseline 2.0" in text and "[1]" not in text
    assert max(len(line) for line in text.splitlines()) <= 220


def test_no_change_by_another_rule_does_not_claim_the_ci_reaches_into_the_band():
    """dcgan's channels_last: CI 1.14-1.19 against a band up to 1.125, read no change by the
    hopeful's confirmation rounds; the note said 'CI 1.14-1.19 reaches into the noise band'."""
    from trainspeed.tune.table import why_no_change

    cleared = Row(knob="channels_last", setting="true", verdict=stats.NO_CHANGE, speedup=1.16,
                  ci=(1.1376, 1.19), noise=0.125)
    assert why_no_change(cleared) == ""
    inside = Row(knob="channels_last", setting="true", verdict=stats.NO_CHANGE, speedup=1.16,
                 ci=(1.10, 1.19), noise=0.125)
    assert why_no_change(inside) == "CI 1.10–1.19 reaches into the noise band 0.89–1.12x"
