"""The loop closes: what a tune measured on a script shows in the doctor's next report of it
(doctor/tuned.py)."""

from __future__ import annotations

import pytest

from trainspeed.doctor.findings import format_findings
from trainspeed.doctor.tuned import annotate, record_tune, script_key

pytestmark = pytest.mark.timeout(30)


def _finding(knobs: str, impact: float = 0.84) -> dict:
    return {"id": "data_bound", "severity": "critical", "title": "Training is data-bound", "impact": impact,
            "evidence": "waiting for the next batch takes 84% of step time", "recommendation": "num_workers=1",
            "verify_with": f"trainspeed tune --knobs {knobs} -- python train.py --epochs 3"}


def test_a_finding_the_tune_measured_as_no_gain_says_so_in_the_next_report(tmp_path):
    key = script_key("path", str(tmp_path / "train.py"))
    rows = [{"knob": "num_workers", "setting": "1", "verdict": "no measurable change", "speedup": 0.98, "ci": [0.9, 1.05]},
            {"knob": "num_workers", "setting": "2", "verdict": "slower", "speedup": 0.8, "ci": [0.7, 0.9]},
            {"knob": "compile", "setting": "default", "verdict": "skipped", "speedup": None, "ci": None}]
    assert record_tune(key, "runs/tune-train", rows, root=tmp_path) == tmp_path / "runs" / "tuned.json"
    findings = annotate([_finding("num_workers"), _finding("compile", 0.1)], key, root=tmp_path)
    assert findings[0]["tuned"] == ("trainspeed tune measured no gain: num_workers=1 0.98x, num_workers=2 0.80x "
                                    "(runs/tune-train)")
    assert "tuned" not in findings[1]  # compile was not measured
    assert "tuned:    trainspeed tune measured no gain" in format_findings(findings)
    # another script in the same folder has no record; a winner reads as a gain
    assert "tuned" not in annotate([_finding("num_workers")], script_key("path", str(tmp_path / "other.py")),
                                   root=tmp_path)[0]
    record_tune(key, "runs/tune-2", [{**rows[0], "verdict": "faster", "speedup": 1.8}], root=tmp_path)
    assert annotate([_finding("num_workers")], key, root=tmp_path)[0]["tuned"] == (
        "trainspeed tune measured a gain: num_workers=1 1.80x (runs/tune-2); an earlier tune read no gain: "
        "num_workers=1 0.98x, num_workers=2 0.80x (runs/tune-train)")
    # beside a winner, the settings that did not win (the finding may advise one of them)
    record_tune(key, "runs/tune-3", [{**rows[0], "verdict": "faster", "speedup": 1.52, "setting": "2"}, rows[0]],
                root=tmp_path)
    assert annotate([_finding("num_workers")], key, root=tmp_path)[0]["tuned"].startswith(
        "trainspeed tune measured a gain: num_workers=2 1.52x (no gain: num_workers=1 0.98x) (runs/tune-3)")


def test_each_tune_of_a_script_is_kept_and_a_later_one_of_other_knobs_leaves_it(tmp_path):
    """A newcomer ran the doctor's one-knob tunes in turn: `--knobs fused_optimizer` verified
    1.39x, then `--knobs num_workers` replaced the script's record and the fused line was gone;
    a third, wider tune on a loaded machine read fused at 0.68x and the report said "no gain"
    with nothing of the first."""
    key = script_key("path", str(tmp_path / "train.py"))
    fused = {"knob": "fused_optimizer", "setting": "fused", "verdict": "faster", "speedup": 1.32, "ci": [1.2, 1.4]}
    workers = {"knob": "num_workers", "setting": "1", "verdict": "slower", "speedup": 0.53, "ci": [0.4, 0.6]}
    record_tune(key, "runs/tune-train-fused_optimizer", [fused], root=tmp_path)
    record_tune(key, "runs/tune-train-num_workers", [workers], root=tmp_path)
    found = annotate([_finding("fused_optimizer"), _finding("num_workers")], key, root=tmp_path)
    assert found[0]["tuned"] == ("trainspeed tune measured a gain: fused_optimizer=fused 1.32x "
                                 "(runs/tune-train-fused_optimizer)")
    assert found[1]["tuned"].endswith("num_workers=1 0.53x (runs/tune-train-num_workers)")
    loaded = {**fused, "verdict": "slower", "speedup": 0.68}
    record_tune(key, "runs/tune-train", [loaded, workers], root=tmp_path)
    assert annotate([_finding("fused_optimizer")], key, root=tmp_path)[0]["tuned"] == (
        "trainspeed tune measured no gain: fused_optimizer=fused 0.68x (runs/tune-train); an earlier tune read "
        "a gain: fused_optimizer=fused 1.32x (runs/tune-train-fused_optimizer)")
    # a tune resumed into its own --out replaces its entry, not adds one
    record_tune(key, "runs/tune-train", [fused], root=tmp_path)
    assert annotate([_finding("fused_optimizer")], key, root=tmp_path)[0]["tuned"] == (
        "trainspeed tune measured a gain: fused_optimizer=fused 1.32x (runs/tune-train)")
    # a record of the first form (one tune per script) still reads
    import json

    (tmp_path / "runs" / "tuned.json").write_text(json.dumps(
        {"schema": 1, "scripts": {key: {"tune": "runs/old", "knobs": {"fused_optimizer": [fused]}}}}))
    assert annotate([_finding("fused_optimizer")], key, root=tmp_path)[0]["tuned"].endswith("1.32x (runs/old)")
    record_tune(key, "runs/new", [workers], root=tmp_path)
    assert "runs/old" in annotate([_finding("fused_optimizer")], key, root=tmp_path)[0]["tuned"]



def test_a_tune_of_the_script_with_other_flags_says_which(tmp_path):
    """word_language_model's doctor run at --emsize 512 showed a tune of --emsize 1024 as its own."""
    key = script_key("path", str(tmp_path / "main.py"))
    row = {"knob": "num_workers", "setting": "1", "verdict": "faster", "speedup": 1.5, "ci": [1.4, 1.6]}
    tuned = ["python", "main.py", "--emsize", "1024"]
    record_tune(key, "runs/tune-main", [row], root=tmp_path, command=tuned)
    plain = "trainspeed tune measured a gain: num_workers=1 1.50x (runs/tune-main)"
    same = annotate([_finding("num_workers")], key, root=tmp_path, command=tuned)[0]["tuned"]
    assert same == plain + ", with the same flags"
    # another interpreter's name runs the same script with the same flags
    assert annotate([_finding("num_workers")], key, root=tmp_path,
                    command=["python3", "main.py", "--emsize", "1024"])[0]["tuned"] == same
    other = annotate([_finding("num_workers")], key, root=tmp_path, command=["python", "main.py", "--emsize", "512"])
    assert other[0]["tuned"] == plain + ", with other flags: --emsize 1024 (here 512)"
    # a record written before the command was kept reads as before
    record_tune(key, "runs/tune-main", [row], root=tmp_path)
    assert annotate([_finding("num_workers")], key, root=tmp_path, command=["python", "main.py"])[0]["tuned"] == plain


def test_a_tune_of_the_doctors_own_command_is_preferred_to_a_newer_one_of_other_flags(tmp_path):
    """A tune of --batch-size 64 ran after a tune of the doctor's very command (--batch-size 32):
    the finding showed the newer one, another workload, as what was measured for it."""
    key = script_key("path", str(tmp_path / "train.py"))
    row = {"knob": "num_workers", "setting": "2", "verdict": "faster", "speedup": 1.6, "ci": [1.5, 1.7]}
    mine = ["python", "train.py", "--batch-size", "32", "--model", "small"]
    record_tune(key, "runs/tune-32", [row], root=tmp_path, command=mine)
    record_tune(key, "runs/tune-64", [{**row, "verdict": "no measurable change", "speedup": 1.01}], root=tmp_path,
                command=["python", "train.py", "--batch-size", "64", "--model", "small", "--amp"])
    assert annotate([_finding("num_workers")], key, root=tmp_path, command=mine)[0]["tuned"] == (
        "trainspeed tune measured a gain: num_workers=2 1.60x (runs/tune-32), with the same flags (a newer tune "
        "ran other flags); a newer tune of other flags read no gain: num_workers=2 1.01x (runs/tune-64)")
    # neither ran the doctor's flags: the newest, with which flags it ran otherwise
    line = annotate([_finding("num_workers")], key, root=tmp_path,
                    command=["python", "train.py", "--batch-size", "16", "--model", "small"])[0]["tuned"]
    assert line.startswith("trainspeed tune measured no gain: num_workers=2 1.01x (runs/tune-64), with other flags: "
                           "--batch-size 64 (here 16), --amp (not here); an earlier tune of other flags read a gain")
    # the other order: the doctor's command is the newest tune, shown as such
    record_tune(key, "runs/tune-32", [row], root=tmp_path, command=mine)
    assert annotate([_finding("num_workers")], key, root=tmp_path, command=mine)[0]["tuned"] == (
        "trainspeed tune measured a gain: num_workers=2 1.60x (runs/tune-32), with the same flags; an earlier "
        "tune of other flags read no gain: num_workers=2 1.01x (runs/tune-64)")


def test_flag_changes_name_what_differs_briefly():
    from trainspeed.doctor.flag_changes import flag_changes

    assert flag_changes(["python", "t.py", "data", "--lr=1e-3", "--amp"], ["python", "t.py", "x", "--lr", "-2"]) == (
        "data (here x), --lr 1e-3 (here -2), --amp (not here)")
    assert flag_changes(["python", "-m", "pkg.train", "model.size=big"],
                        ["python", "-m", "pkg.train", "model.size=small", "--compile"]) == (
        "model.size big (here small), without --compile")
    assert flag_changes(["t.py", "--a", "1", "--b", "2"], ["t.py", "--b", "2", "--a", "1"]) == ""  # order only
    assert flag_changes(["t.py", *"--a --b --c --d --e".split()], ["t.py"]).endswith(", +2 more")


def test_stakes_order_the_knobs_and_mark_the_rows():
    from trainspeed.tune.result import Row
    from trainspeed.tune.stakes import mark_stakes, order_by_stake

    findings = [_finding("compile", 0.05), _finding("num_workers", 0.56), _finding("precision", 0.4),
                _finding("log_every", 0.0)]
    assert order_by_stake(["threads", "log_every", "precision", "compile", "num_workers"], findings) == [
        "num_workers", "precision", "compile", "threads", "log_every"]  # nothing at stake: not ahead
    # a finding without a figure (an older report) still leads: its stake is unknown, not nothing
    assert order_by_stake(["threads", "compile"], [{"verify_with": "trainspeed tune --knobs compile -- x"}]) == [
        "compile", "threads"]
    rows = [Row(knob="num_workers", setting="1"), Row(knob="threads", setting="1")]
    mark_stakes(rows, findings)
    assert rows[0].stake == 0.56 and rows[1].stake is None


def test_the_console_names_first_only_the_knobs_moved_first():
    """makemore at --budget 10m: "the baseline's findings name compile: measured first" of a
    finding with nothing at stake, and compile went unmeasured for the budget, last in line."""
    from trainspeed.tune.stakes import order_by_stake, order_line

    knobs = ["num_workers", "log_every", "precision", "compile", "threads"]
    said = order_line(knobs, [_finding("compile", 0.0)], "the baseline's findings")
    assert order_by_stake(knobs, [_finding("compile", 0.0)]) == knobs
    assert "measured first" not in said and "compile" in said and "usual order" in said, said
    said = order_line(knobs, [_finding("compile", 0.0), _finding("precision", 0.4)], "the baseline's findings")
    assert said.startswith("the baseline's findings put time at stake on precision: measured first"), said
    assert "compile: nothing at stake" in said


def test_under_a_run_with_plan_a_finding_is_shown_the_tune_of_its_own_knob():
    """The demo's after-run (num_workers=2 applied): every finding's tune measures num_workers
    first, and each then carried the workers' tuned line, "The model is not compiled" too."""
    from trainspeed.doctor.tuned import tuned_line

    entry = {"tunes": [{"tune": "tune", "knobs": {
        "num_workers": [{"setting": "2", "verdict": "faster", "speedup": 1.65}],
        "compile": [{"setting": "default", "verdict": "slower", "speedup": 0.4}]}}]}
    compile_finding = {"verify_with": "trainspeed tune --knobs num_workers,compile -- python train.py"}
    persistent = {"verify_with": "trainspeed tune --knobs num_workers,persistent_workers -- python train.py"}
    workers = {"verify_with": "trainspeed tune --knobs num_workers -- python train.py"}
    assert tuned_line(compile_finding, entry, applied=["num_workers"]) == (
        "trainspeed tune measured no gain: compile=default 0.40x (tune)")
    assert tuned_line(persistent, entry, applied=["num_workers"]) is None  # persistent_workers: not measured
    assert tuned_line(workers, entry, applied=["num_workers"]).startswith("trainspeed tune measured a gain: num_workers=2")
    assert tuned_line(persistent, entry).startswith("trainspeed tune measured a gain: num_workers=2")  # no plan


@pytest.mark.timeout(120)
def test_the_reports_top_shows_what_a_tune_measured_of_its_knobs(doctor, tmp_path):
    """A newcomer's top kept "DataLoader workers (now 0) ..." and "Measure it: --knobs
    num_workers,..." after a tune had measured workers at 0.53x; the findings below said so, the
    top did not."""
    import json

    from doctor_helpers import SCRIPTS
    from trainspeed.doctor.checks.bound import format_time_goes

    key = script_key("path", str(SCRIPTS / "healthy.py"))
    rows = [{"knob": k, "setting": s, "verdict": "slower", "speedup": x, "ci": None}
            for k, s, x in (("precision", "bf16", 0.6), ("compile", "default", 0.5), ("threads", "1", 0.7))]
    record_tune(key, "runs/tune-healthy", rows, root=tmp_path)
    result = doctor("healthy.py", steps=30)
    goes = json.loads((result.run_dir / "report.json").read_text())["time_goes"]
    assert goes["verify_with"] and goes["tuned"].startswith("trainspeed tune measured no gain: "), goes
    assert "(runs/tune-healthy)" in goes["tuned"]
    assert "\nMeasured: trainspeed tune measured no gain: " in format_time_goes(goes)
    assert all(f.get("tuned") != goes["tuned"] or f.get("verify_with") for f in result.findings)
    assert goes not in result.findings  # annotated beside the findings, not one of them


def test_a_figure_no_verdict_judged_says_why_beside_it(tmp_path):
    """super_resolution on a busy machine: 'trainspeed tune measured a gain: compile=default 1.38x
    (no gain: threads=1 1.62x, ...)': the 1.62x was left unjudged (the load differed), and read as
    a larger gain than the one kept."""
    key = script_key("path", str(tmp_path / "main.py"))
    rows = [{"knob": "compile", "setting": "default", "verdict": "faster", "speedup": 1.38, "ci": [1.29, 1.48]},
            {"knob": "threads", "setting": "1", "verdict": "not measurable while the machine is busy",
             "speedup": 1.62, "ci": [1.5, 1.73]},
            {"knob": "precision", "setting": "bf16", "verdict": "loss mismatch", "speedup": 1.2, "ci": [1.1, 1.3]}]
    record_tune(key, "runs/tune-main", rows, root=tmp_path)
    line = annotate([_finding("threads,precision,compile")], key, root=tmp_path)[0]["tuned"]
    assert line == ("trainspeed tune measured a gain: compile=default 1.38x (no gain: threads=1 1.62x (other "
                    "processes' load differed, not kept), precision=bf16 1.20x (its loss differed, not kept)) "
                    "(runs/tune-main)")


def test_a_winner_the_tune_did_not_keep_and_a_figure_inside_the_noise_say_so(tmp_path):
    """A newcomer's doctor read "measured a gain: threads=1 5.61x" of a tune that kept nothing (its
    verification was not measurable on the busy machine), and another "no gain: fused 3.22x"."""
    key = script_key("path", str(tmp_path / "main.py"))
    rows = [{"knob": "threads", "setting": "1", "settings": {"env.threads": 1}, "verdict": "faster",
             "speedup": 5.61, "ci": [4.0, 7.0]},
            {"knob": "fused_optimizer", "setting": "fused", "settings": {"optim.fused": True},
             "verdict": "no measurable change", "speedup": 3.22, "ci": [0.9, 9.0]}]
    record_tune(key, "runs/tune-main", rows, root=tmp_path, kept={})
    line = annotate([_finding("threads,fused_optimizer")], key, root=tmp_path)[0]["tuned"]
    assert line == ("trainspeed tune measured a gain: threads=1 5.61x (faster alone; not kept in best.yaml) "
                    "(no gain: fused_optimizer=fused 3.22x (inside the noise)) (runs/tune-main)")
    record_tune(key, "runs/tune-main", rows, root=tmp_path, kept={"env.threads": 1})  # kept: nothing to add
    assert annotate([_finding("threads")], key, root=tmp_path)[0]["tuned"] == (
        "trainspeed tune measured a gain: threads=1 5.61x (runs/tune-main)")


def _advising(setting: str) -> dict:
    return {**_finding("num_workers", 0.3), "recommendation": f"2 workers share 2 cores: use fewer (num_workers={setting})",
            "advises": {"num_workers": setting}, "otherwise": "make per-sample work cheaper"}


def test_advice_a_tune_measured_as_no_gain_is_replaced_by_what_it_measured(tmp_path):
    """The demo's after-run, on the tune's num_workers=2, advised "use fewer (num_workers=1)": that
    tune had read 1 at 1.00x and 2 at 1.64x over the script's 0."""
    key = script_key("path", str(tmp_path / "train.py"))
    command = ["python", "train.py", "--epochs", "3"]
    one = {"knob": "num_workers", "setting": "1", "verdict": "no measurable change", "speedup": 1.0, "ci": [0.95, 1.05]}
    two = {"knob": "num_workers", "setting": "2", "verdict": "faster", "speedup": 1.64, "ci": [1.44, 1.86]}
    record_tune(key, "tune", [one, two], root=tmp_path, command=command)
    # this run applied the tune's plan (run --with tune/best.yaml): keep it
    [after] = annotate([_advising("1")], key, root=tmp_path, command=command, applied=["num_workers"])
    assert after["recommendation"] == ("keep the tune's num_workers: it measured num_workers=2 at 1.64x and "
                                       "num_workers=1 at 1.00x (no measurable change) (tune); make per-sample "
                                       "work cheaper")
    # a run of the script as it is: the winner instead, and the command that runs it
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "best.yaml").write_text("kind: script-settings\n")
    [before] = annotate([_advising("1")], key, root=tmp_path, command=command)
    assert before["recommendation"] == (
        "num_workers=2, not 1: trainspeed tune measured it at 1.64x and num_workers=1 at 1.00x (no measurable "
        "change) (tune); `trainspeed run --with tune/best.yaml -- python train.py --epochs 3` runs the tune's "
        "settings; make per-sample work cheaper")
    # a tune whose --out lies outside the working directory: its plan by its absolute path (the
    # doctor crashed here, Path.relative_to)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere" / "data bound"
    elsewhere.mkdir(parents=True)
    (elsewhere / "best.yaml").write_text("kind: script-settings\n")
    record_tune(key, str(elsewhere), [one, two], root=tmp_path, command=command)
    [far] = annotate([_advising("1")], key, root=tmp_path, command=command)
    assert f"`trainspeed run --with '{elsewhere / 'best.yaml'}' -- python train.py --epochs 3`" in far["recommendation"]
    # advice the tune measured as a gain, or did not measure, stands
    assert annotate([_advising("2")], key, root=tmp_path, command=command)[0]["recommendation"].endswith("(num_workers=2)")
    assert annotate([_advising("3")], key, root=tmp_path, command=command)[0]["recommendation"].endswith("(num_workers=3)")


def test_advice_with_no_winner_beside_it_says_what_was_measured(tmp_path):
    key = script_key("path", str(tmp_path / "train.py"))
    slower = {"knob": "num_workers", "setting": "1", "verdict": "slower", "speedup": 0.53, "ci": [0.4, 0.6]}
    record_tune(key, "runs/tune-train", [slower], root=tmp_path)
    [f] = annotate([_advising("1")], key, root=tmp_path)
    assert f["recommendation"] == ("not num_workers=1: trainspeed tune measured num_workers=1 at 0.53x (slower) "
                                   "(runs/tune-train); make per-sample work cheaper")
    # a busy machine's figure refutes nothing
    record_tune(key, "runs/tune-busy", [{**slower, "verdict": "not measurable while the machine is busy"}], root=tmp_path)
    assert annotate([_advising("1")], key, root=tmp_path)[0]["recommendation"].endswith("(num_workers=1)")


def test_a_knob_advised_at_all_is_refuted_only_when_every_setting_was_no_gain(tmp_path):
    """"The model is not compiled: model = torch.compile(model)" after a tune read compile at 0.82x."""
    key = script_key("path", str(tmp_path / "train.py"))
    compiled = {**_finding("compile", 0.0), "recommendation": "model = torch.compile(model)", "advises": {"compile": "*"}}
    record_tune(key, "runs/t1", [{"knob": "compile", "setting": "default", "verdict": "no measurable change",
                                  "speedup": 0.82, "ci": [0.7, 0.95]}], root=tmp_path)
    assert annotate([dict(compiled)], key, root=tmp_path)[0]["recommendation"] == (
        "not compile: trainspeed tune measured compile=default at 0.82x (no measurable change) (runs/t1)")
    record_tune(key, "runs/t2", [{"knob": "compile", "setting": "default", "verdict": "faster", "speedup": 1.3,
                                  "ci": [1.2, 1.4]},
                                 {"knob": "compile", "setting": "max-autotune", "verdict": "slower", "speedup": 0.7,
                                  "ci": [0.6, 0.8]}], root=tmp_path)
    assert annotate([dict(compiled)], key, root=tmp_path)[0]["recommendation"] == "model = torch.compile(model)"
