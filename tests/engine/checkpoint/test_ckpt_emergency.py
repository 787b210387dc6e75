from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from trainspeed.engine.checkpoint.emergency import EmergencySaver, is_oom

pytestmark = pytest.mark.timeout(90)


def test_sigterm_sets_flag_and_exits_143():
    before = signal.getsignal(signal.SIGTERM)
    seen = []
    with EmergencySaver(on_signal=seen.append) as saver:
        assert saver.installed and not saver.requested
        saver.exit()  # nothing requested: a no-op
        os.kill(os.getpid(), signal.SIGTERM)
        assert saver.requested and saver.signal_name == "SIGTERM" and saver.exit_code == 143
        assert seen == [signal.SIGTERM]
        with pytest.raises(SystemExit) as info:
            saver.exit()
        assert info.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is before


def test_sighup_saves_like_sigterm_and_exits_129():
    """The terminal or SSH session closed: SIGHUP ended a run at once, with no save."""
    before = signal.getsignal(signal.SIGHUP)
    with EmergencySaver() as saver:
        if signal.getsignal(signal.SIGHUP) is before:  # os.kill would end pytest itself
            pytest.fail("SIGHUP is not handled while training")
        os.kill(os.getpid(), signal.SIGHUP)
        assert saver.requested and saver.signal_name == "SIGHUP" and saver.exit_code == 129
        with pytest.raises(SystemExit) as info:
            saver.exit()
        assert info.value.code == 129
    assert signal.getsignal(signal.SIGHUP) is before


def test_a_sighup_ignored_by_nohup_stays_ignored():
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with EmergencySaver() as saver:
            assert saver.installed and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)


def test_sigint_first_sets_flag_second_interrupts_at_once():
    before = signal.getsignal(signal.SIGINT)
    with EmergencySaver() as saver:
        os.kill(os.getpid(), signal.SIGINT)  # first Ctrl-C: no exception, just the request
        assert saver.requested and saver.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # second Ctrl-C while "saving"
        with pytest.raises(KeyboardInterrupt):
            saver.exit()
    assert signal.getsignal(signal.SIGINT) is before


def test_off_main_thread_is_inactive_with_warning():
    result = {}

    def run():
        with pytest.warns(UserWarning, match="main thread"):
            with EmergencySaver() as saver:
                result["installed"] = saver.installed

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert result == {"installed": False}
    with EmergencySaver(enabled=False) as saver:
        assert not saver.installed


def test_is_oom():
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("CUDA error: out of memory"))
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes. Error code 12 (Cannot allocate memory) out of memory"))
    assert is_oom(MemoryError())
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))  # only runtime/memory errors count


SCRIPT = textwrap.dedent(
    """
    import sys, torch
    from trainspeed.engine.checkpoint import CheckpointManager, EmergencySaver, TrainState, build_checkpoint
    events = []
    mgr = CheckpointManager(sys.argv[1], async_save=True, on_event=events.append)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with EmergencySaver() as emergency:
        step = 0
        while True:
            step += 1
            model(torch.randn(2, 4)).sum().backward(); opt.step(); opt.zero_grad()
            if step == 3:
                print("running", flush=True)
            if emergency.requested:
                mgr.save(build_checkpoint(model, opt, counters=TrainState(step=step)), step)
                mgr.close()
                print("saved", step, events[-1]["type"], flush=True)
                emergency.exit()
    """
)


def test_sigterm_in_a_training_loop_saves_then_exits_143(tmp_path):
    from trainspeed.engine.checkpoint import CheckpointManager, restore_checkpoint

    script = tmp_path / "loop.py"
    script.write_text(SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ck")],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "running"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143
    _, step, kind = out.split()
    path = CheckpointManager(tmp_path / "ck").find_resumable()
    assert path is not None and kind == "checkpoint"
    counters = restore_checkpoint(torch.load(path, weights_only=True), torch.nn.Linear(4, 4))
    assert counters.step == int(step) >= 3


DOUBLE_TERM = textwrap.dedent("""
    import os, signal, sys
    from trainspeed.engine.checkpoint.emergency import EmergencySaver
    with EmergencySaver() as saver:
        saver.DUPLICATE_S = float(sys.argv[1])
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # torchrun's second, a millisecond later
        print("alive", saver.requested, flush=True)
""")


@pytest.mark.parametrize("grace, alive", [(5.0, True), (0.0, False)])
def test_a_launchers_duplicate_sigterm_does_not_kill_the_save(grace, alive):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(__import__("pathlib").Path(__file__).parents[3] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", DOUBLE_TERM, str(grace)], capture_output=True, text=True,
                          env=env, timeout=60)
    if alive:  # within the grace period: one request, the save goes on
        assert proc.returncode == 0 and proc.stdout.strip() == "alive True", proc.stderr
    else:  # a second SIGTERM after it: terminated at once, as a shell shows it
        assert proc.returncode == -signal.SIGTERM and "alive" not in proc.stdout
