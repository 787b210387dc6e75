"""Commands the doctor prints carry the environment variables the user's run had that change
how torch or the script behaves: time_sequence_prediction runs only with
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1, and its report's commands left it out (crashed as written)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from trainspeed.doctor.checks import CheckContext
from trainspeed.doctor.checks.no_step import _weights_only_advice
from trainspeed.doctor.instrument.run_env import carried_env
from trainspeed.telemetry.rundir import RunData
from trainspeed.telemetry.schema import make_event
from trainspeed.telemetry.summary import summarize

pytestmark = pytest.mark.timeout(120)


def test_the_variables_that_change_torch_or_the_script_are_carried_and_no_others(monkeypatch):
    environ = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
               "TORCHINDUCTOR_CACHE_DIR": "/c", "CUDA_VISIBLE_DEVICES": "1", "HF_HUB_OFFLINE": "1",
               "WANDB_MODE": "offline", "OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", "PATH": "/bin",
               "TRAINSPEED_LAUNCHER": "[]", "TORCHELASTIC_RESTART_COUNT": "0", "PYTHONPATH": ".",
               "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    assert sorted(carried_env(environ)) == [
        "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "PYTORCH_CUDA_ALLOC_CONF", "TORCHINDUCTOR_CACHE_DIR",
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "WANDB_MODE"]
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # torch writes its default cache folder into its own environment at its first compile
    assert "TORCHINDUCTOR_CACHE_DIR" not in carried_env({"TORCHINDUCTOR_CACHE_DIR": default_cache_dir(),
                                                         "TORCH_WARM_POOL": "0"})
    # under a launcher: the variables of the doctor that started it, not what the launcher added
    launched = {"CUDA_VISIBLE_DEVICES": "0,1", "TRAINSPEED_CARRIED_ENV": '{"TORCH_EXTENSIONS_DIR": "/x"}'}
    assert carried_env(launched) == {"TORCH_EXTENSIONS_DIR": "/x"}
    # set by trainspeed's own hf recipe in this process (an earlier run in it): not the user's
    from trainspeed import own_env

    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")  # so that the test's end restores the original
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    monkeypatch.setattr(own_env, "SET_BY_TRAINSPEED", set())
    own_env.setdefault("TRANSFORMERS_OFFLINE", "1")
    assert carried_env({"TRANSFORMERS_OFFLINE": "1"}) == {}
    # lightning.fabric sets it when imported: a rerun imports it again
    assert carried_env({"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}) == {}
    # in a torchrun worker the agent set it (default 1): the command starts torchrun, which sets it again
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in carried_env({**environ, "TORCHELASTIC_RUN_ID": "x"})


def _ctx(env, pythonpath=None):
    doctor = {"kind": "doctor", "stopped": "steps", "steps": 4, "max_steps": 4,
              **({"env": env} if env else {}), **({"pythonpath": pythonpath} if pythonpath else {})}
    steps = [{"schema": 1, "step": i, "t_step": 0.01, "phases": {"forward": 0.01}, "warmup": i == 1}
             for i in range(1, 5)]
    run = RunData(path=Path("run"), config={"command": ["python", "train.py", "--steps", "4"]}, steps=steps,
                  events=[make_event("run_start", 0, 0.0, device="cpu", precision="fp32"),
                          make_event("observation", 0, 0.0, **doctor)])
    return CheckContext.from_run(run, summarize(run))


def test_doctor_and_tune_commands_carry_the_recorded_variables_sorted_and_quoted():
    ctx = _ctx({"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1", "TORCHINDUCTOR_CACHE_DIR": "/my cache"}, pythonpath=".")
    head = "PYTHONPATH=. TORCHINDUCTOR_CACHE_DIR='/my cache' TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 "
    assert ctx.doctor_command(steps=8) == head + "trainspeed doctor --steps 8 -- python train.py --steps 4"
    assert ctx.tune_command("compile") == head + "trainspeed tune --knobs compile -- python train.py --steps 4"
    words = shlex.split(ctx.doctor_command())  # the shell reads it back as typed
    assert words[1] == "TORCHINDUCTOR_CACHE_DIR=/my cache" and words[3] == "trainspeed"
    assert _ctx({}).doctor_command(steps=8) == "trainspeed doctor --steps 8 -- python train.py --steps 4"


def test_the_crash_findings_own_variable_is_named_once_with_its_fix_over_the_runs_value():
    _, verify = _weights_only_advice(_ctx({"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "0", "WANDB_MODE": "offline"}))
    assert verify == ("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 WANDB_MODE=offline trainspeed doctor --steps 4 -- "
                      "python train.py --steps 4")


def test_a_doctor_run_records_the_variables_and_every_verify_command_carries_them(tmp_path, monkeypatch):
    from doctor_helpers import observations, run_inline

    monkeypatch.setenv("TORCH_SHOW_CPP_STACKTRACES", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the tune's threads knob varies it: not carried
    monkeypatch.chdir(tmp_path)
    result = run_inline(tmp_path, (
        "import time, torch\n"
        "m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for i in range(50):\n"
        "    time.sleep(0.003)\n"
        "    loss = m(torch.randn(8, 4)).pow(2).mean(); print(loss.item())\n"
        "    opt.zero_grad(); loss.backward(); opt.step()\n"), steps=12)
    assert observations(result, "doctor")[0]["env"] == {"TORCH_SHOW_CPP_STACKTRACES": "1"}
    verify = [f["verify_with"] for f in result.findings 
              if any(f"trainspeed {c} " in (f.get("verify_with") or "") for c in ("doctor", "tune", "run"))]
    assert verify and all(v.startswith("TORCH_SHOW_CPP_STACKTRACES=1 trainspeed ") for v in verify), verify
