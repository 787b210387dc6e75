"""A failed trial says why. A script trial runs the doctor with --quiet, which prints nothing
on stderr: dcgan's bf16 trial read "exit code 1; stderr tail:" and nothing after it, while its
run directory held the crash."""

from __future__ import annotations

import json

from trainspeed.tune.trials import _classify_failure, _crash_of

TRACEBACK = """Traceback (most recent call last):
  File "/x/src/trainspeed/doctor/runner.py", line 341, in run_doctor
  File "/home/u/dcgan/main.py", line 243, in <module>
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1783, in _wrapped_call_impl
  File "/home/u/dcgan/main.py", line 198, in forward
RuntimeError: Input type (CPUBFloat16Type) and weight type (torch.FloatTensor) should be the same
"""


def test_the_crash_in_the_run_directory_is_the_error(tmp_path):
    error = "RuntimeError: Input type (CPUBFloat16Type) and weight type (torch.FloatTensor) should be the same"
    rows = [{"type": "run_start", "data": {}}, {"type": "crash", "data": {"error": error, "traceback": TRACEBACK}}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    crash = _crash_of(tmp_path)
    assert crash == f"{error} (at main.py:198)"  # the innermost frame of the script's own code
    assert _classify_failure(1, "", crash) == f"exit code 1: {crash}"


def test_without_a_crash_record_the_stderr_tail_or_its_absence_is_said(tmp_path):
    assert _crash_of(tmp_path) is None
    assert _classify_failure(2, "usage: train.py\ntrain.py: error: unrecognized arguments: --x\n") == (
        "exit code 2: train.py: error: unrecognized arguments: --x; stderr tail:\n"
        "usage: train.py\ntrain.py: error: unrecognized arguments: --x")
    assert _classify_failure(1, "") == "exit code 1, nothing on stderr"
    assert _classify_failure(1, "", "torch.OutOfMemoryError: CUDA out of memory").startswith("OOM (exit 1)")


def test_a_traceback_on_stderr_puts_its_exception_on_the_first_line():
    """The console and the table show a failure's first line: pytorch/examples' mnist read
    "exit code 1; stderr tail:" there, the NameError only in tune.jsonl."""
    stderr = ('Traceback (most recent call last):\n  File "/x/trainspeed/cli/run.py", line 113, in run\n'
              '    result = run_doctor(config)\n  File "/x/trainspeed/doctor/checks/bound.py", line 44, in _helps\n'
              "    helps = _waiting_helps(ctx)\nNameError: name '_waiting_helps' is not defined\n")
    first = _classify_failure(1, stderr).splitlines()[0]
    assert first == "exit code 1: NameError: name '_waiting_helps' is not defined (at bound.py:44); stderr tail:"


def test_a_onednn_kernel_the_cpu_lacks_is_said_to_be_the_machines_not_the_scripts():
    # word_language_model's bf16 trial on a CI CPU ended with only oneDNN's words
    crash = ("RuntimeError: could not create a primitive descriptor for the LSTM forward propagation primitive. "
             "Run workload with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information."
             " (main.py:163)")
    text = _classify_failure(1, "", crash)
    assert text.startswith("exit code 1: oneDNN (PyTorch's CPU kernels) has no kernel on this CPU for an op of the "
                           "model in the setting's dtype, so the setting cannot run here; not a fault of the script: ")
    assert text.endswith(crash)
    stderr = "Traceback (most recent call last):\n  ...\n" + crash.rsplit(" (", 1)[0] + "\n"
    assert "has no kernel on this CPU" in _classify_failure(1, stderr) and "LSTM forward" in _classify_failure(1, stderr)
