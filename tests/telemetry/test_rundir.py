from __future__ import annotations

import json

import numpy as np
import pytest

from trainspeed.errors import RunDirError, SchemaError
from trainspeed.telemetry import schema
from trainspeed.telemetry.rundir import read_run, write_config, write_json

pytestmark = pytest.mark.timeout(30)


def _step(i: int, **extra) -> dict:
    record = {"schema": 1, "step": i, "t_step": 0.01 * i, "phases": {"forward": 0.001 * i}}
    record.update(extra)
    return record


def test_malformed_lines_are_skipped_and_reported(tmp_path):
    lines = [json.dumps(_step(1)), "{not json", json.dumps([1, 2]), json.dumps({"schema": 1}),
             json.dumps(_step(2, mem={"rss": 5})), '{"schema": 1, "step": 3, "t_st']
    (tmp_path / "steps.jsonl").write_text("\n".join(lines))
    run = read_run(tmp_path)
    assert [r["step"] for r in run.steps] == [1, 2]
    assert run.skipped == [
        "steps.jsonl line 2: not valid JSON",
        "steps.jsonl line 3: not a JSON object",
        "steps.jsonl line 4: missing step, t_step",
        "steps.jsonl line 6: incomplete last line (the writer stopped mid-line)",
    ]
    np.testing.assert_allclose(run.array("phases.forward"), [0.001, 0.002])
    rss = run.array("mem.rss")
    assert np.isnan(rss[0]) and rss[1] == 5


def _restart(at: int) -> dict:
    return {"schema": 1, "type": "restart", "step": at, "data": {"path": "ckpt", "at_step": at}}


def test_steps_a_resume_ran_again_are_read_once_from_the_run_that_went_on(tmp_path):
    """Killed at step 7 after its step-4 checkpoint, a run recorded steps 5-7; the resume from
    step 4 recorded them again: the run read 13 steps of 10, three of them twice."""
    first = [_step(i, loss=1.0) for i in range(1, 8)]
    again = [_step(i, loss=2.0) for i in range(5, 11)]
    (tmp_path / "steps.jsonl").write_text("\n".join(json.dumps(r) for r in [*first, *again]) + "\n")
    (tmp_path / "events.jsonl").write_text(json.dumps(_restart(4)) + "\n")
    run = read_run(tmp_path)
    assert [r["step"] for r in run.steps] == list(range(1, 11))
    assert [r["loss"] for r in run.steps] == [1.0] * 4 + [2.0] * 6
    assert run.skipped == ["steps.jsonl: steps 5-7 ran twice, before a restart from an earlier checkpoint and "
                           "after it: the records of the run that went on are kept"]
    # without a restart, repeated step numbers are a loop's own (a Monitor made again): all kept
    (tmp_path / "events.jsonl").write_text("")
    assert [r["step"] for r in read_run(tmp_path).steps] == sorted([*range(1, 8), *range(5, 11)])


def test_newer_schema_is_a_clear_error(tmp_path):
    (tmp_path / "steps.jsonl").write_text(json.dumps({"schema": 2, "step": 1, "t_step": 1}) + "\n")
    with pytest.raises(SchemaError, match="schema 2.*reads schema <= 1.*Upgrade"):
        read_run(tmp_path)


def test_not_a_run_directory(tmp_path):
    with pytest.raises(RunDirError, match="not a directory"):
        read_run(tmp_path / "missing")
    with pytest.raises(RunDirError, match="not a trainspeed run directory"):
        read_run(tmp_path)


def test_atomic_json_and_config_round_trip(tmp_path):
    write_json(tmp_path / "report.json", {"schema": 1, "x": float("nan"), "y": (1, 2)})
    write_config(tmp_path, {"data": {"num_workers": 2}})
    run = read_run(tmp_path)
    assert run.report == {"schema": 1, "x": None, "y": [1, 2]}
    assert run.config == {"data": {"num_workers": 2}}
    assert not list(tmp_path.glob(".*.tmp"))


def test_dumps_turns_non_finite_into_null():
    line = schema.dumps({"loss": float("nan"), "nested": {"v": float("inf")}})
    assert json.loads(line) == {"loss": None, "nested": {"v": None}}
