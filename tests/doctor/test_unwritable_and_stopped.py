"""Telemetry never breaks the user's run: a run directory that cannot be written (removed,
full) leaves the script running to its own exit code, said once; a doctor stopped by SIGTERM
(`timeout 150 trainspeed doctor ...`) writes its report from what it recorded."""

from __future__ import annotations

import errno
import os

import pytest

from trainspeed.doctor.runner import DoctorConfig, run_doctor

pytestmark = pytest.mark.timeout(90)

SCRIPT = """
import os, signal, sys, torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(sys.argv[1])):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step + 1 == int(sys.argv[2]):
        sig = getattr(signal, sys.argv[4] if len(sys.argv) > 4 else "SIGTERM")
        if signal.getsignal(sig) is signal.SIG_DFL:  # unhandled, it would end pytest itself
            sys.exit(99)
        os.kill(os.getpid(), sig)
sys.exit(int(sys.argv[3]))
"""


def _script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def test_an_unwritable_run_directory_keeps_the_script_and_its_exit_code(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("where the run directory's parent should be")
    result = run_doctor(DoctorConfig(command=["python", str(_script(tmp_path)), "12", "-1", "3"],
                                     steps=None, out=blocker / "run", system_sampler=False))
    assert result.exit_code == 3 and result.stopped == "exit"  # the script's own status
    assert result.steps == 12  # every step ran and was timed
    err = capsys.readouterr().err
    assert err.count("cannot write the run directory") == 1, err
    assert "Traceback" not in err


def test_a_full_disk_mid_run_is_said_once_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    from doctor_helpers import step_records_fill_after

    monkeypatch.chdir(tmp_path)
    step_records_fill_after(monkeypatch, 3)
    result = run_doctor(DoctorConfig(command=["python", str(_script(tmp_path)), "30", "-1", "0"],
                                     steps=None, out=tmp_path / "run", system_sampler=False, log_every=2))
    assert result.exit_code == 0 and result.steps == 30
    err = capsys.readouterr().err
    assert err.count("No space left on device") == 1, err
    assert f"cannot write the run directory {tmp_path / 'run'}" in err  # names what is full
    assert "Traceback" not in err


def test_sigterm_stops_the_doctor_with_its_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_doctor(DoctorConfig(command=["python", str(_script(tmp_path)), "1000", "15", "0"],
                                     steps=None, out=tmp_path / "run", system_sampler=False, log_every=5))
    assert result.stopped == "signal" and result.exit_code == 143
    assert result.steps == 15
    import json

    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["doctor"]["stopped"] == "signal" and report["doctor"]["steps"] == 15
    assert isinstance(report["findings"], list)


def test_sighup_stops_the_doctor_with_its_report(tmp_path, monkeypatch):
    """The terminal or SSH session closed: SIGHUP ended the doctor and the script at once, with
    no report of the steps it had measured."""
    import json
    import signal

    monkeypatch.chdir(tmp_path)
    before = signal.getsignal(signal.SIGHUP)
    result = run_doctor(DoctorConfig(command=["python", str(_script(tmp_path)), "1000", "12", "0", "SIGHUP"],
                                     steps=None, out=tmp_path / "run", system_sampler=False, log_every=5))
    assert result.stopped == "signal" and result.exit_code == 129 and result.steps == 12
    assert json.loads((tmp_path / "run" / "report.json").read_text())["doctor"]["stopped"] == "signal"
    assert signal.getsignal(signal.SIGHUP) is before


def test_a_half_written_line_is_cut_back(tmp_path, monkeypatch):
    from trainspeed.sinks.jsonl import open_append, write_all

    path = tmp_path / "events.jsonl"
    fd = open_append(path)
    write_all(fd, b'{"a": 1}\n')
    real = os.write
    state = {"first": True}

    def short_then_full(f, data):
        if state["first"]:
            state["first"] = False
            return real(f, bytes(data)[:5])  # what fits
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", short_then_full)
    with pytest.raises(OSError):
        write_all(fd, b'{"b": 2, "c": 3}\n')
    monkeypatch.setattr(os, "write", real)
    os.close(fd)
    assert path.read_bytes() == b'{"a": 1}\n'


@pytest.fixture
def ctrl_c_raises():
    """SIGINT as at a terminal (KeyboardInterrupt), also where the tests run as a background job
    of a shell without job control (`make test &`, CI's nohup): such a job inherits SIGINT
    ignored, Python then installs no handler, and the script's Ctrl-C did nothing."""
    import signal

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_under_the_doctor_is_an_interrupt_with_its_report(tmp_path, monkeypatch, ctrl_c_raises):
    import json

    monkeypatch.chdir(tmp_path)
    result = run_doctor(DoctorConfig(command=["python", str(_script(tmp_path)), "1000", "9", "0", "SIGINT"],
                                     steps=None, out=tmp_path / "run", system_sampler=False, log_every=3))
    assert result.stopped == "interrupt" and result.exit_code == 130 and result.steps == 9
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["traceback"] is None  # a stop, not a crash
    events = [json.loads(x)["type"] for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert "interrupt" in events and "crash" not in events


def test_slurms_sigusr1_stops_the_doctor_with_its_report(tmp_path, monkeypatch):
    """sbatch --signal=USR1@90: SIGUSR1's default action ended the doctor and the script at once,
    with no report. Taken after the script's first step, where the script set no handler."""
    import json
    import signal

    monkeypatch.chdir(tmp_path)
    result = run_doctor(DoctorConfig(command=["python", str(_script(tmp_path)), "1000", "12", "0", "SIGUSR1"],
                                     steps=None, out=tmp_path / "run", system_sampler=False, log_every=5))
    assert result.stopped == "signal" and result.exit_code == 138 and result.steps == 12
    assert json.loads((tmp_path / "run" / "report.json").read_text())["doctor"]["stopped"] == "signal"
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_a_scripts_own_sigusr1_handler_is_left_to_it(tmp_path, monkeypatch):
    """Lightning sets its SLURM requeue handler only where SIGUSR1 has none: one set by the
    doctor before the script ran would have taken its place."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "own.py"
    path.write_text("import signal\nseen = []\nsignal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))\n"
                    + SCRIPT.replace("sys.exit(int(sys.argv[3]))", "sys.exit(int(sys.argv[3]) if seen else 98)"))
    import signal

    before = signal.getsignal(signal.SIGUSR1)
    try:
        result = run_doctor(DoctorConfig(command=["python", str(path), "30", "12", "0", "SIGUSR1"],
                                         steps=None, out=tmp_path / "run", system_sampler=False, log_every=5))
    finally:  # the script ran in this process: its handler would outlive it here
        signal.signal(signal.SIGUSR1, before)
    assert result.exit_code == 0 and result.steps == 30  # its handler ran (else 98), the run went on
