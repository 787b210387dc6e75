"""A second doctor run into the same --out reports that run only: the earlier run's files move,
untouched, into earlier-runs/<its start time>/ (the newest few are kept), said in one line. A
folder that holds anything but a trainspeed run's files is refused, with nothing written."""

from __future__ import annotations

import json
import threading
import time

import pytest

from trainspeed.doctor.runner import DoctorConfig, run_doctor
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(120)

SCRIPT = """
import sys, torch
from torch import nn
if "--fail" in sys.argv:
    import torchvision_is_not_installed_here  # the first attempt's mistake
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(12):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
"""


def _doctor(tmp_path, out, *args):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    return run_doctor(DoctorConfig(command=["python", str(script), *args], steps=None, out=out,
                                   system_sampler=False))


def _events(run_dir):
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line]


def _earlier_run(folder, started: float, steps: int = 3):
    """A finished doctor run's files, as run_doctor writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text("command: [python, train.py]\n")
    (folder / "events.jsonl").write_text(json.dumps({"schema": 1, "type": "run_start", "step": 0,
                                                     "t_wall": started, "data": {}}) + "\n")
    (folder / "steps.jsonl").write_text("".join(json.dumps({"schema": 1, "step": s}) + "\n"
                                                for s in range(1, steps + 1)))


def test_a_rerun_after_a_failed_attempt_reports_itself_only(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert _doctor(tmp_path, out, "--fail").stopped == "crash"
    capsys.readouterr()
    result = _doctor(tmp_path, out)
    assert result.stopped == "end" and result.steps == 12

    events = _events(out)
    assert [e["type"] for e in events].count("run_start") == 1  # was 2: appended to the first run's
    assert not [e for e in events if e["type"] == "crash"]
    assert len((out / "steps.jsonl").read_text().splitlines()) == 12
    report = (out / "report.json").read_text()
    assert "torchvision_is_not_installed_here" not in report and "crash" not in report.lower()

    (earlier,) = (out / "earlier-runs").iterdir()  # the first attempt, whole, beside the new run
    assert [e["type"] for e in _events(earlier)].count("crash") == 1
    assert "torchvision_is_not_installed_here" in (earlier / "report.json").read_text()
    err = capsys.readouterr().err
    assert err.count("held an earlier run") == 1 and str(earlier) in err, err


def test_only_the_newest_earlier_runs_are_kept(tmp_path, monkeypatch, capsys):
    from trainspeed.doctor.earlier_run import KEEP_EARLIER

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    kept = out / "earlier-runs"
    for day in range(1, KEEP_EARLIER + 1):  # runs set aside earlier
        _earlier_run(kept / f"2024010{day}-120000", time.time())
    (kept / "my-notes").mkdir()  # not one of ours: never pruned
    _earlier_run(out, time.time() - 60)
    _doctor(tmp_path, out)

    names = sorted(p.name for p in kept.iterdir())
    assert len(names) == KEEP_EARLIER + 1 and "my-notes" in names
    assert "20240101-120000" not in names  # the oldest went
    assert "20240102-120000" in names
    assert [e["type"] for e in _events(out)].count("run_start") == 1
    assert "removed the oldest, 20240101-120000" in capsys.readouterr().err


@pytest.mark.parametrize("mine", [["train_copy.py", "notes.txt"], ["checkpoints/step_100.pt"], ["config.yaml"]])
def test_a_folder_of_the_users_is_refused_and_left_as_it_was(tmp_path, monkeypatch, mine):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "mine"
    for name in mine:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("the user's")
    if "checkpoints/step_100.pt" in mine:  # an engine run: records and checkpoints
        _earlier_run(out, time.time() - 60)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))

    with pytest.raises(ConfigError, match="nothing was written") as caught:
        _doctor(tmp_path, out)
    assert str(out) in str(caught.value)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    assert all((out / name).read_text() == "the user's" for name in mine)


def test_a_later_rank_waits_until_rank0_set_the_earlier_run_aside(tmp_path, monkeypatch):
    """torchrun: rank 1 wrote ranks/rank1 at once, appended to the earlier run's rank 1, and rank 0
    then moved the earlier run's ranks/ (this run's rank 1 inside) aside."""
    from trainspeed.doctor.earlier_run import set_aside_earlier_run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "out"
    _earlier_run(out, time.time() - 3600)
    _earlier_run(out / "ranks" / "rank1", time.time() - 3600)
    moved = []
    rank0 = threading.Timer(1.0, lambda: moved.append(set_aside_earlier_run(out)))
    rank0.start()
    try:
        result = _doctor(tmp_path, out)
    finally:
        rank0.join()
    assert result.steps == 12 and moved[0] is not None
    rank1 = out / "ranks" / "rank1"
    assert [e["type"] for e in _events(rank1)].count("run_start") == 1
    assert len((rank1 / "steps.jsonl").read_text().splitlines()) == 12
    assert len((moved[0] / "ranks" / "rank1" / "steps.jsonl").read_text().splitlines()) == 3  # the earlier one
    # and rank 0, had it looked only now, leaves this run's rank 1 alone
    assert set_aside_earlier_run(out) is None and (rank1 / "steps.jsonl").is_file()
