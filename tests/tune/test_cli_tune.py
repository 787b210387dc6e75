"""End to end: `trainspeed tune` runs real trials of a tiny gpt in subprocesses, writes a
loadable best.yaml and its tables, and a rerun resumes without running anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainspeed.config import load_config
from trainspeed.tune import stats

SRC = str(Path(__file__).resolve().parents[2] / "src")
TINY = ["recipe.options.size=null", "recipe.options.n_layer=1", "recipe.options.n_head=2",
        "recipe.options.n_embd=32", "recipe.options.block_size=32", "data.batch_size=4",
        "recipe.options.samples_per_epoch=256", "recipe.options.val_samples=16"]


def tune(out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "trainspeed", "tune", "gpt", *TINY, "--knobs", "torch_threads",
           "--out", str(out), "--steps", "4", "--warmup-steps", "1", "--repeats", "1",
           "--verify-repeats", "0", "--budget", "5m", "--max-rounds", "1"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)


@pytest.mark.slow  # 10-40 s: started first under xdist (tests/conftest.py)
def test_tune_cli_real_trials_best_yaml_tables_and_resume(tmp_path):
    out = tmp_path / "tune"
    first = tune(out)
    assert first.returncode == 0, first.stderr[-3000:]
    data = json.loads((out / "tune.json").read_text())
    rows = {(r["knob"], r["setting"]): r for r in data["ablation"]}
    # The old name of the knob is read as its one name now, and said so.
    assert "knob 'torch_threads' is now called 'threads'" in first.stderr
    threads = [r for (k, _), r in rows.items() if k == "threads"]
    assert threads, data["ablation"]
    measured = [r for r in threads if r["verdict"] != "skipped"]
    if (os.cpu_count() or 1) > 1:
        # A real measurement: a speedup, an interval, a loss delta and a verdict word.
        assert measured and measured[0]["speedup"] > 0 and measured[0]["ci"]
        # (or the tune's own "not measurable while the machine is busy": a loaded machine's verdict)
        assert measured[0]["verdict"] in ("faster", "slower", "no measurable change", stats.BUSY)
        assert measured[0]["loss_delta"] is not None
    # The baseline runs before the candidates and again after each pair (--baseline-every 2);
    # --max-rounds 1 keeps a setting that reads faster to its one round (the CI machine's
    # threads=1 read "faster" and got its confirming rounds: 6 trials).
    assert data["trials_run"] == 1 + len(measured) + -(-len(measured) // 2)
    assert len((out / "tune.jsonl").read_text().splitlines()) == data["trials_run"]
    # best.yaml is a config `trainspeed train` loads: the user's model, settings applied.
    best = load_config(out / "best.yaml")
    assert best.recipe.options["n_embd"] == 32 and best.run.max_steps == 200
    for key, value in data["best_settings"].items():
        section, name = key.split(".")
        assert getattr(getattr(best, section), name) == value
    html = (out / "tune.html").read_text()
    assert "Ablation" in html and "threads" in html
    assert "| threads |" in (out / "tune.md").read_text()
    assert "speedup" in first.stdout and "best config" in first.stdout
    # The gpt recipe's FLOPs and the measured CPU peak give the baseline's MFU (a real
    # reading: under 100 %, named after the peak it is relative to).
    assert 0 < data["baseline_mfu"] <= 1 and "measured" in data["peak_name"]
    from trainspeed.tune.table import mfu_text

    assert mfu_text(data["baseline_mfu"]) in first.stdout

    again = tune(out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming" in again.stdout
    assert json.loads((out / "tune.json").read_text())["trials_run"] == 0


def test_tune_cli_rejects_an_unknown_knob(tmp_path, capsys):
    # the CLI's own main in this process: a fresh interpreter only added its torch import
    from trainspeed.cli.main import main

    assert main(["tune", "gpt", "--knobs", "precison", "--out", str(tmp_path)]) == 2
    assert "did you mean 'precision'" in capsys.readouterr().err


def test_no_winner_line_tells_unmeasured_from_measured_and_slower():
    from trainspeed.cli.tune import no_winner_line
    from trainspeed.tune.result import Row, TuneResult

    killed = Row(knob="compile", setting="default", verdict="slower", note="far slower: stopped after 30 s")
    common = dict(combination=[], best_settings={}, final=None, baseline_cost_s=1e-3, trials_run=3,
                  trials_reused=0, elapsed_s=40.0)
    unmeasured = TuneResult(ablation=[killed], **common)
    line = no_winner_line(unmeasured)
    assert line.startswith("no setting could be measured") and "compile=default: far slower" in line
    lost = Row(knob="num_workers", setting="2", verdict="slower", speedup=0.8)
    assert no_winner_line(TuneResult(ablation=[killed, lost], **common)).startswith("nothing won over the baseline")


def test_no_winner_line_names_an_undecided_setting_as_undecided():
    """nanoGPT's 20-minute compile tune on a busy machine: 1.08x over four rounds, CI 1.00-1.15, in
    a ±10 % band; the closing line said the script was 'already the fastest measured here'."""
    from trainspeed.cli.tune import no_winner_line
    from trainspeed.tune.result import Row, TuneResult

    common = dict(combination=[], best_settings={}, final=None, baseline_cost_s=1e-3, trials_run=9,
                  trials_reused=0, elapsed_s=900.0)
    row = Row(knob="compile", setting="--compile=True", verdict="no measurable change", speedup=1.08,
              ci=(0.998, 1.15), noise=0.10)
    assert no_winner_line(TuneResult(ablation=[row], **common)) == (
        "nothing is kept, nor known to lose: compile=--compile=True read 1.08x (CI 1.00–1.15), undecided within "
        "this machine's run-to-run noise (±10%); rerun on a quieter machine, or with the same --out and a larger "
        "--budget for more rounds")
    # one that reads no faster than the floor, or whose interval stops short of it, is measured and lost
    for speedup, ci in ((1.01, (0.9, 1.12)), (1.04, (0.99, 1.02))):
        flat = Row(knob="compile", setting="default", verdict="no measurable change", speedup=speedup, ci=ci, noise=0.1)
        assert no_winner_line(TuneResult(ablation=[flat], **common)).startswith("nothing won over the baseline")


def test_no_winner_line_names_what_read_faster_inside_the_noise():
    """dcgan on a noisy VM: channels_last 1.16x (CI 1.14-1.19) and fused 1.12x in the table,
    each 'no measurable change' against a 13 % noise band, and the closing line said the
    script's settings were 'already the fastest measured here'."""
    from trainspeed.cli.tune import no_winner_line
    from trainspeed.tune.result import Row, TuneResult

    common = dict(combination=[], best_settings={}, final=None, baseline_cost_s=1e-3, trials_run=9,
                  trials_reused=0, elapsed_s=200.0)
    rows = [Row(knob="fused_optimizer", setting="fused", verdict="no measurable change", speedup=1.12,
                ci=(1.08, 1.15), noise=0.1),
            Row(knob="channels_last", setting="true", verdict="no measurable change", speedup=1.16,
                ci=(1.14, 1.19), noise=0.2),
            Row(knob="num_workers", setting="1", verdict="no measurable change", speedup=1.05, ci=(0.9, 1.2),
                noise=0.3),
            Row(knob="threads", setting="1", verdict="slower", speedup=0.8, ci=(0.7, 0.85), noise=0.1)]
    assert no_winner_line(TuneResult(ablation=rows, **common)) == (
        "nothing is kept: channels_last=true 1.16x, fused_optimizer=fused 1.12x read faster, but not beyond this "
        "machine's run-to-run noise (±20%); rerun on a quieter machine, or with the same "
        "--out and a larger --budget for more rounds")


def test_nothing_won_says_no_patch_and_names_no_stale_patch(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    # A second tune in the same --out where nothing won: best.patch of the first stayed, and
    # nothing said there was no patch (`git apply` then failed, or applied the old change).
    # The outputs' commit removes it now (test_output_set.py); a stale one left is never named.
    from trainspeed.cli.tune import outcome_lines
    from trainspeed.tune.result import Row, TuneResult

    (tmp_path / "best.patch").write_text("--- a/train.py\n")
    (tmp_path / "code_change.md").write_text("old change\n")
    (tmp_path / "tune.json").write_text(json.dumps({"patch": None}))
    common = dict(combination=[], final=None, baseline_cost_s=1e-3, trials_run=3, trials_reused=0, elapsed_s=40.0)
    lost = Row(knob="num_workers", setting="2", verdict="slower", speedup=0.8)
    lines = outcome_lines(TuneResult(ablation=[lost], best_settings={}, **common), tmp_path, ["python", "train.py"])
    assert lines[-1].startswith("no patch: nothing won") and "best.patch" in lines[-1]
    # a winner, and a best.patch tune.json does not name (an earlier tune's, left): not offered
    won = TuneResult(ablation=[lost], best_settings={"threads": 1}, **common)
    assert "git apply" not in "\n".join(outcome_lines(won, tmp_path, ["python", "train.py"]))
    # a winner with its patch: both named
    (tmp_path / "best.patch").write_text("--- a/train.py\n")
    (tmp_path / "tune.json").write_text(json.dumps({"patch": "best.patch"}))
    won = TuneResult(ablation=[lost], best_settings={"threads": 1}, **common)
    text = "\n".join(outcome_lines(won, tmp_path, ["python", "train.py"]))
    assert "trainspeed run --with" in text and f"git apply {tmp_path / 'best.patch'}" in text
    # only what-ifs won (an interval edit, verified as code): best.yaml holds no setting, so
    # "run it now: trainspeed run --with best.yaml" ran the script unchanged
    (tmp_path / "tune.json").write_text(json.dumps({"patch": "best.patch", "tuned_command": ["python", "train.py"]}))
    edit = TuneResult(ablation=[lost], best_settings={"whatif.save_every": 4}, **common)
    lines = outcome_lines(edit, tmp_path, ["python", "train.py"])
    assert not any("--with" in line for line in lines)
    assert lines[0].startswith(f"apply it:     git apply {tmp_path / 'best.patch'}") and lines[1].endswith("python train.py")


def test_the_next_commands_carry_the_pythonpath_the_tune_ran_with(tmp_path, monkeypatch):
    # minGPT's projects/adder/adder.py imports the checkout's mingpt: `PYTHONPATH=. trainspeed tune
    # -- python projects/adder/adder.py` ran, then printed "run it now: trainspeed run --with ...
    # -- python projects/adder/adder.py", which fails on the import as printed
    from trainspeed.cli.tune import outcome_lines, resume_command
    from trainspeed.tune.result import Row, TuneResult

    src = str(Path(__file__).resolve().parents[2] / "src")  # trainspeed's own entry: left out
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([src, "."]))
    (tmp_path / "tune.json").write_text(json.dumps({"patch": None}))
    won = Row(knob="num_workers", setting="0", verdict="faster", speedup=1.2)
    result = TuneResult(ablation=[won], best_settings={"loader.num_workers": 0}, combination=[], final=None,
                        baseline_cost_s=1e-3, trials_run=3, trials_reused=0, elapsed_s=40.0)
    command = ["python", "projects/adder/adder.py"]
    assert outcome_lines(result, tmp_path, command)[0] == (
        f"run it now:   PYTHONPATH=. trainspeed run --with {tmp_path / 'best.yaml'} -- python projects/adder/adder.py")
    assert resume_command(["tune", "--", *command], tmp_path) == \
        f"PYTHONPATH=. trainspeed tune --out {tmp_path} -- python projects/adder/adder.py"
    monkeypatch.setenv("PYTHONPATH", src)
    assert resume_command(["tune", "--", *command], tmp_path).startswith("trainspeed tune --out")


def run_verify(won):
    """verify.verify on a tuner with --verify-repeats 0: no trial may run."""
    from types import SimpleNamespace

    from trainspeed.tune.verify import verify

    def no_trial(*args, **kwargs):
        raise AssertionError("a verification round ran with --verify-repeats 0")

    said = []
    tuner = SimpleNamespace(say=said.append, verify_as=lambda best: best, cost_factor={}, _key=str,
                            opt=SimpleNamespace(repeats=2, verify_repeats=0), next_repeat={}, _round=no_trial,
                            row=no_trial, describe=lambda best: won.setting)
    row = verify(tuner, {"precision.mode": "bf16-mixed"})
    assert not any("verifying" in line for line in said), said  # it verifies nothing
    return row


def test_no_winner_line_when_a_winner_was_not_verified():
    # transformers' run_clm.py, tune --budget 6m: bf16 1.15x alone (CI 1.13-1.17), then "budget
    # ran out before this trial" for the verification; the line said the script's settings were
    # "already the fastest measured here".
    from trainspeed.cli.tune import no_winner_line
    from trainspeed.tune.result import Row, TuneResult
    from trainspeed.tune.verify import VERIFY_OFF

    bf16 = Row(knob="precision", setting="bf16", verdict="faster", speedup=1.15, ci=(1.13, 1.17))
    lost = Row(knob="threads", setting="1", verdict="slower", speedup=0.69)
    final = Row(knob="combined", setting="--bf16 True, --use_cpu True", note="budget ran out before this trial")
    common = dict(combination=[], best_settings={}, baseline_cost_s=1e-3, trials_run=30, trials_reused=0,
                  elapsed_s=370.0)
    line = no_winner_line(TuneResult(ablation=[bf16, lost], final=final, **common))
    assert line.startswith("nothing is kept: precision=bf16 (1.15x) won alone")
    assert "(budget ran out before this trial)" in line and "larger --budget" in line
    assert "already the fastest" not in line
    # --verify-repeats 0: no verification was asked for, and the rerun that runs it says so (a
    # DeepSpeed script's tune said "budget ran out" with 9 of its 10 minutes left)
    off = run_verify(bf16)
    assert off.verdict == "skipped" and off.note == VERIFY_OFF
    line = no_winner_line(TuneResult(ablation=[bf16, lost], final=off, **common))
    assert line.endswith(f"but {VERIFY_OFF}; rerun with the same --out and --verify-repeats 3 to verify it "
                         "from these trials") and "budget" not in line
    verified_lost = Row(knob="combined", setting="bf16", verdict="no measurable change", speedup=1.01)
    # verified and lost: the line names the winner whose gain did not hold (it said "nothing won")
    assert no_winner_line(TuneResult(ablation=[bf16, lost], final=verified_lost, **common)) == (
        "nothing is kept: precision=bf16 (1.15x) won alone, but verified against the baseline it read 1.01x: the "
        "gain did not hold")
    # nanoGPT's fused: 1.19x alone, verified at 1.09x (CI 1.08-1.10) inside a ±20 % band: faster, not
    # beyond the noise; the line said the script's settings were "already the fastest measured here"
    inside = Row(knob="combined", setting="optimizer.impl=fused", verdict="no measurable change", speedup=1.09,
                 ci=(1.08, 1.10), noise=0.20)
    line = no_winner_line(TuneResult(ablation=[bf16, lost], final=inside, **common))
    assert line.startswith("nothing is kept: precision=bf16 (1.15x) won alone, and verified against the baseline "
                           "read 1.09x (CI 1.08–1.10), faster but not beyond this machine's run-to-run noise (±20%)")
    assert "already the fastest" not in line and "larger --budget" in line


def test_no_winner_line_names_the_settings_the_budget_left_unmeasured():
    # pytorch/examples' reinforce.py, tune --budget 3m: 2 settings measured and lost, the others
    # did not fit the budget or were stopped before a baseline trial's time, and the line said
    # the script's settings were "already the fastest measured here"
    from trainspeed.cli.tune import no_winner_line
    from trainspeed.tune.result import Row, TuneResult

    common = dict(combination=[], best_settings={}, baseline_cost_s=1e-3, trials_run=9, trials_reused=0,
                  elapsed_s=180.0)
    lost = Row(knob="threads", setting="1", verdict="slower", speedup=0.8)
    flat = Row(knob="compile", setting="default", verdict="no measurable change", speedup=1.0, ci=(0.9, 1.02))
    fp16 = Row(knob="precision", setting="fp16", verdict="skipped",
               note="fp16 autocast on a CPU is emulated and far slower; bf16 is tried")
    fits = [Row(knob="optimizer", setting=s, verdict="skipped",
                note=f"does not fit the budget (~{n} s for 2 repeats; --budget 5m measures it)")
            for s, n in (("foreach", 90), ("fused", 95))]
    stopped = Row(knob="precision", setting="bf16", verdict="skipped",
                  note="stopped as far slower after 30 s, while plain baseline trials took up to 43 s: nothing "
                       "measured, no verdict; rerun with the same --out and a larger --budget to measure it")
    line = no_winner_line(TuneResult(ablation=[lost, flat, fp16, *fits, stopped], final=None, **common))
    assert line.startswith("nothing won over the baseline among the 2 setting(s) measured; not measured: "
                           "optimizer=foreach, optimizer=fused: does not fit the budget (~90 s"), line
    assert "precision=bf16: stopped as far slower" in line and "fp16" not in line
    assert "already the fastest" not in line and line.endswith("a larger --budget to measure them from these trials")
    # every setting measured or skipped on purpose: the script's settings are the fastest measured
    assert no_winner_line(TuneResult(ablation=[lost, flat, fp16], final=None, **common)) == (
        "nothing won over the baseline: your script's settings are already the fastest measured here")


def test_no_winner_line_names_a_faster_setting_refused_for_its_loss_and_the_tolerance_to_keep_it():
    # dcgan --manualSeed 1 (stored trials without a tail scatter): bf16 1.10x, refused for
    # optimizerG's loss +8.1 % against the 5 % floor; the line said "already the fastest measured"
    from trainspeed.cli.tune import no_winner_line
    from trainspeed.tune.result import Row, TuneResult

    common = dict(combination=[], best_settings={}, baseline_cost_s=1e-3, trials_run=6, trials_reused=0,
                  elapsed_s=30.0)
    bf16 = Row(knob="precision", setting="bf16", verdict="loss mismatch", speedup=1.10, ci=(1.07, 1.12),
               loss_delta=0.081, note="optimizerG's loss 3.138 vs baseline 2.902: beyond a tolerance of 5.0%")
    line = no_winner_line(TuneResult(ablation=[bf16], final=None, **common))
    assert line == ("nothing is kept: precision=bf16 read 1.10x faster, but its loss was +8.1% off the baseline's, "
                    "beyond the tolerance (its note says whose and why). Where that difference is acceptable for "
                    "your model, rerun with the same --out and --loss-tolerance 0.1")
    # a loss that went non-finite is never offered a larger tolerance
    bf16.loss_delta = float("inf")
    assert "--loss-tolerance" not in no_winner_line(TuneResult(ablation=[bf16], final=None, **common))


def test_no_winner_line_when_the_edit_of_a_whatif_winner_did_not_verify():
    # the what-if (every 4th save) won at 3.9x; best.patch's edit, run in the verification,
    # changed nothing (an epoch-local step counter): the line says the edit was measured
    from trainspeed.cli.tune import no_winner_line
    from trainspeed.tune.result import Row, TuneResult

    won = Row(knob="checkpoint_every", setting="every 4th save (what-if)", verdict="faster", speedup=3.9)
    final = Row(knob="combined", setting="whatif.save_every=4 as code (best.patch)", settings={"code.save_every": 4},
                verdict="no measurable change", speedup=1.09, ci=(0.75, 1.65), noise=0.18,
                note="measured the patched code (best.patch's edit: train.py:16: the interval on line 15, 2 -> 8)")
    common = dict(combination=[], best_settings={}, baseline_cost_s=1e-3, trials_run=8, trials_reused=0,
                  elapsed_s=70.0)
    line = no_winner_line(TuneResult(ablation=[won], final=final, **common))
    assert line.startswith("nothing is kept: checkpoint_every=every 4th save (what-if) (3.90x) won, but best.patch's "
                           "edit of your code, run in the verification, read 'no measurable change' (CI 0.75–1.65 "
                           "reaches into the noise band"), line
    assert line.endswith("no patch on that evidence")
    failed = Row(knob="combined", setting="whatif.save_every=4 as code (best.patch)", settings={"code.save_every": 4},
                 verdict="failed", note="not verified: the patched code did not run (code.save_every=4: the edit could "
                                        "not be made at train.py:15: no save call in a statement at line 15); no best.patch")
    assert no_winner_line(TuneResult(ablation=[won], final=failed, **common)) == (
        "nothing is kept: checkpoint_every=every 4th save (what-if) (3.90x) won, but not verified: the patched code "
        "did not run (code.save_every=4: the edit could not be made at train.py:15: no save call in a statement at "
        "line 15); no best.patch")


def test_no_winner_line_names_a_winner_whose_verification_was_undecided_or_lost():
    """word_language_model's 3m tune: fused AdamW won alone at 1.17x (CI 1.07-1.26), then the
    verification read 1.08x (CI 1.00-1.15) in a ±14 % band, and the closing line said the
    script's settings were 'already the fastest measured here'."""
    from trainspeed.cli.tune import no_winner_line
    from trainspeed.tune.result import Row, TuneResult

    won = Row(knob="fused_optimizer", setting="fused", verdict="faster", speedup=1.17, ci=(1.07, 1.26), noise=0.05)
    common = dict(ablation=[won], combination=[won], best_settings={}, baseline_cost_s=1e-3, trials_run=17,
                  trials_reused=0, elapsed_s=175.0)

    def verified(speedup: float, ci: tuple[float, float], verdict: str = "no measurable change") -> str:
        final = Row(knob="combined", setting="optimizer.impl=fused", verdict=verdict, speedup=speedup, ci=ci,
                    noise=0.14)
        return no_winner_line(TuneResult(final=final, **common))

    assert verified(1.08, (0.998, 1.15)) == (
        "nothing is kept, nor known to lose: fused_optimizer=fused (1.17x) won alone, but verified against the "
        "baseline it read 1.08x (CI 1.00–1.15), undecided within this machine's run-to-run noise (±14%); rerun on "
        "a quieter machine, or with the same --out and a larger --budget for more verification rounds")
    # a verification reading no faster, or slower, says the gain did not hold
    for speedup, ci, verdict in ((1.01, (0.95, 1.06), "no measurable change"), (0.8, (0.75, 0.85), "slower")):
        assert verified(speedup, ci, verdict) == (
            f"nothing is kept: fused_optimizer=fused (1.17x) won alone, but verified against the baseline it read "
            f"{speedup:.2f}x (CI {ci[0]:.2f}–{ci[1]:.2f}): the gain did not hold")
    # faster within its own rounds: as before
    assert verified(1.09, (1.08, 1.10)).startswith(
        "nothing is kept: fused_optimizer=fused (1.17x) won alone, and verified against the baseline read 1.09x")


def test_the_next_commands_carry_the_variables_the_trials_ran_with(tmp_path, monkeypatch):
    # time_sequence_prediction runs only with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1: a `run --with` or
    # resume command without it crashes on the script's torch.load as printed
    from trainspeed.cli.tune import outcome_lines, resume_command
    from trainspeed.tune.result import Row, TuneResult

    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # what the threads knob varies: left out
    (tmp_path / "tune.json").write_text(json.dumps({"patch": None}))
    won = Row(knob="num_workers", setting="0", verdict="faster", speedup=1.2)
    result = TuneResult(ablation=[won], best_settings={"loader.num_workers": 0}, combination=[], final=None,
                        baseline_cost_s=1e-3, trials_run=3, trials_reused=0, elapsed_s=40.0)
    command = ["python", "train.py", "--steps", "2"]
    assert outcome_lines(result, tmp_path, command)[0] == (
        f"run it now:   TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 trainspeed run --with {tmp_path / 'best.yaml'} -- "
        "python train.py --steps 2")
    assert resume_command(["tune", "--", *command], tmp_path) == \
        f"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 trainspeed tune --out {tmp_path} -- python train.py --steps 2"
