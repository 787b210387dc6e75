"""Training in processes the script starts itself (pytorch/examples' mnist_hogwild: two
`mp.Process(target=train)` children, spawn method). The doctor saw 0 steps in the script's own
process, ran the whole epoch, and called it "an inference-only script?"; a tune's settings never
reached the children. Now each child runs under a doctor session of its own and the run directory
reads them as ranks (doctor/spawned.py); `run --with` applies its settings in them too."""

from __future__ import annotations

import json
import sys

import pytest

from doctor_helpers import SCRIPTS

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _start_method_restored():
    """The script sets the spawn method for the whole process (it runs in-process, as under the
    doctor): left so, a later test's DataLoader workers would re-run its script as __mp_main__."""
    import multiprocessing

    before = multiprocessing.get_start_method(allow_none=True)
    yield
    multiprocessing.set_start_method(before, force=True)


def test_the_spawned_trainers_are_followed_and_read_as_ranks(doctor):
    result = doctor("hogwild_spawn.py", "--epochs", "3", steps=12)
    run = result.run_dir
    assert result.steps == 12 and result.exit_code == 0, result.traceback
    ids = [f["id"] for f in result.findings]
    assert "no_step_found" not in ids
    # torch gives each process a thread per core: 2 processes oversubscribe any machine
    over = next(f for f in result.findings if f["id"] == "threads_oversubscribed")
    assert over["title"].startswith("2 training processes run") and "torch.set_num_threads(" in over["recommendation"]
    assert "--knobs threads --" in over["verify_with"] and "torchrun" not in over["verify_with"]
    ranks = result.summary["ranks"]
    assert ranks is not None and len(ranks["rows"] if isinstance(ranks, dict) else ranks) == 2, ranks
    # each child stopped at --steps (3 epochs of 32 would be 96): 12 steps in either
    assert sum(1 for _ in open(run / "ranks" / "rank1" / "steps.jsonl")) == 12
    # the script's own process is kept apart; nothing left half-moved
    assert (run / "launcher" / "events.jsonl").is_file() and not (run / "spawned").exists()
    report = json.loads((run / "report.json").read_text())
    assert report["doctor"]["steps"] == 12
    # the children's flags are the script's: advice and verify lines can name them
    flags = [json.loads(line) for line in open(run / "events.jsonl")]
    assert any(e["type"] == "observation" and e["data"].get("kind") == "script_flags" for e in flags)


def test_a_target_that_exits_zero_is_not_a_crash(doctor, capsys):
    result = doctor("hogwild_spawn.py", "--epochs", "1", "--exit-zero", steps=None)
    assert result.steps == 32 and "done [0, 0]" in capsys.readouterr().out
    events = [json.loads(line) for line in open(result.run_dir / "events.jsonl")]
    doctor_obs = [e["data"] for e in events if e["type"] == "observation" and e["data"].get("kind") == "doctor"]
    assert doctor_obs and doctor_obs[0]["stopped"] == "exit" and doctor_obs[0]["exit_code"] == 0


def test_run_with_applies_its_settings_in_the_spawned_trainers(tmp_path, monkeypatch):
    from trainspeed.cli.main import main

    monkeypatch.chdir(tmp_path)
    plan = tmp_path / "best.yaml"
    plan.write_text("schema: 1\nkind: script-settings\ncommand: []\nsettings:\n  threads: 1\n"
                    "  loader.num_workers: 1\n")
    code = main(["run", "--with", str(plan), "--doctor", "--steps", "8", "--out", str(tmp_path / "r"), "--quiet",
                 "--", sys.executable, str(SCRIPTS / "hogwild_spawn.py"), "--epochs", "2"])
    assert code == 0
    notes = json.loads((tmp_path / "r" / "patches.json").read_text())["notes"]
    # the children's own notes: their DataLoader (built in train(), not in the script's process) got a worker
    assert "threads: torch.set_num_threads(1)" in notes
    assert any(n.startswith("DataLoader at hogwild_spawn.py:") and n.endswith("num_workers=1") for n in notes), notes


HELPER = '''
import multiprocessing as mp
import time
import torch


def helper(seconds):
    time.sleep(seconds)


if __name__ == "__main__":
    mp.set_start_method("spawn", force=True)
    side = mp.Process(target=helper, args=(0.1,))
    side.start()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(12):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    side.join()
'''


def test_a_helper_process_that_trains_nothing_leaves_no_records(tmp_path, monkeypatch):
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(HELPER)
    result = run_doctor(DoctorConfig(command=["python", "train.py"], steps=None, out=tmp_path / "run",
                                     system_sampler=False))
    assert result.steps == 12 and not result.summary.get("ranks")
    assert not (tmp_path / "run" / "spawned").exists() and not (tmp_path / "run" / "launcher").exists()


@pytest.mark.parametrize("processes,threads,cores,found", [(2, 2, 2, "critical"), (2, 1, 2, None),
                                                            (3, 1, 2, "warning"), (1, 8, 8, None)])
def test_threads_oversubscribed_counts_every_process_s_threads(processes, threads, cores, found):
    """torchrun's processes get OMP_NUM_THREADS=1 (nothing to say); a script's own processes get
    torch's thread per core each (mnist_hogwild: 2 x 2 on 2 cores)."""
    from dataclasses import replace

    from test_checks import ctx_of, make_run
    from trainspeed.doctor.checks.threads import oversubscribed_threads

    run = make_run()
    run = replace(run, env={"cpu": {"torch_threads": threads, "available_cores": cores}},
                  rank_steps={r: run.steps for r in range(1, processes)})
    finding = oversubscribed_threads(ctx_of(run))
    assert (finding.severity if finding else None) == found
    if finding and threads > 1:
        assert f"torch.set_num_threads({max(1, cores // processes)})" in finding.recommendation
    elif finding:  # one thread each already: fewer processes, not fewer threads
        assert finding.recommendation.startswith(f"start at most {cores} training processes")
