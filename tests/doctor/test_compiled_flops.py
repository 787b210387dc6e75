"""A compiled model's FLOPs are counted too: llama2.c with --compile=True read "MFU not
measured" (and "AdamW over OptimizedModule") where its eager run read 18.9 %. The counted step
runs eagerly under FlopCounterMode; TorchDynamo does not recompile for it."""

from __future__ import annotations

import json

import pytest

from trainspeed.doctor.instrument.flop_window import room_for_an_eager_step
from trainspeed.doctor.instrument.updates import module_class

pytestmark = pytest.mark.timeout(180)

SCRIPT = '''import torch
class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)
    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))
torch.manual_seed(0)
model = torch.compile(MLP(), backend="aot_eager")  # AOTAutograd's graphs, without inductor's build
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(40):
    x = torch.randn(32, 64)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
'''


def test_a_compiled_models_step_is_counted_and_named_by_its_model(tmp_path, monkeypatch):
    import torch
    from torch._dynamo.utils import counters

    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    torch._dynamo.reset()
    counters.clear()
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        result = run_doctor(DoctorConfig(command=["python", "train.py"], steps=12, out=tmp_path / "run",
                                         system_sampler=False))
        # torch's warning about global hooks firing again for the compiled wrapper is about the
        # doctor's hooks: not printed to the user, and the filter that hides it is gone after
        assert not [w for w in caught if "global hooks" in str(w.message)], [str(w.message) for w in caught]
        assert warnings.filters == before
    assert result.steps == 12, result.traceback
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    flops = [e["data"]["flops_per_step"] for e in events if e["type"] == "flops"]
    # forward 2 x 32 x (64 x 256 + 256 x 64) MACs, backward twice that less the input's gradient
    forward = 2 * 32 * (64 * 256 * 2)
    assert flops == [pytest.approx(3 * forward - forward / 2)], flops
    assert result.summary["mfu"]["valid"] and 0 < result.summary["mfu"]["value"] <= 1, result.summary["mfu"]
    models = [e["data"] for e in events if e["type"] == "observation" and e["data"].get("kind") == "model"]
    assert models and models[0]["class"] == "MLP" and models[0]["compiled"] is True
    # the counted step ran the frames eagerly: the compiled graph was not built again
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    torch._dynamo.reset()


def test_module_class_unwraps_torch_compile_and_the_cpu_has_room():
    import torch

    net = torch.nn.Linear(2, 2)
    assert module_class(torch.compile(net, backend="eager")) == "Linear" and module_class(net) == "Linear"
    assert room_for_an_eager_step()  # no CUDA here: a CPU step is counted


def test_no_flops_counts_nothing(tmp_path, monkeypatch):
    # the escape for a compiled model whose eager step would not fit: no counted step, no MFU
    from trainspeed.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT.replace('torch.compile(MLP(), backend="aot_eager")', "MLP()"))
    assert main(["doctor", "--no-flops", "--steps", "10", "--no-html", "--out", str(tmp_path / "run"),
                 "--", "python", "train.py"]) == 0
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["type"] == "flops"]
    assert json.loads((tmp_path / "run" / "report.json").read_text())["summary"]["mfu"] is None


def test_a_compiled_model_without_room_says_why_it_has_no_mfu(tmp_path, monkeypatch):
    from trainspeed.doctor.instrument import flop_window
    from trainspeed.doctor.runner import DoctorConfig, run_doctor
    from trainspeed.report.fmt import mfu_text

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(flop_window, "room_for_an_eager_step", lambda: False)
    (tmp_path / "train.py").write_text(SCRIPT)
    result = run_doctor(DoctorConfig(command=["python", "train.py"], steps=12, out=tmp_path / "run",
                                     system_sampler=False))
    assert result.steps == 12, result.traceback
    mfu = result.summary["mfu"]
    assert mfu["value"] is None and not mfu["valid"] and mfu["note"] == flop_window.NO_ROOM
    assert mfu_text(mfu).startswith("not measured (the model is compiled and one eager step")


def test_a_time_limited_run_counts_no_step_it_cannot_afford():
    from trainspeed.doctor.instrument.flop_window import affordable

    # time_sequence_prediction in a 10-minute tune's first trial (limit 48 s): 46 s in after a first
    # step of 44 s, a counted step of up to 3 such steps would end at 178 s
    assert not affordable(46.0, 44.0, 48.0)
    assert affordable(3.0, 0.5, 48.0)  # a 0.5 s step, 3 s in: counted
    assert affordable(12.0, 12.0, 48.0) and not affordable(12.5, 12.5, 48.0)


# (a busy machine only lengthens the start-up and the steps: the counted case has room for that)
@pytest.mark.parametrize("sleep_s, limit_s, counted", [(0.0, 8.0, True), (0.6, 1.5, False)])
def test_a_tunes_first_trial_counts_flops_only_where_the_time_limit_allows(tmp_path, monkeypatch, sleep_s, limit_s,
                                                                          counted):
    from trainspeed.doctor.instrument import flop_window
    from trainspeed.doctor.runner import DoctorConfig, run_doctor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import time\n" + SCRIPT.replace(
        'torch.compile(MLP(), backend="aot_eager")', "MLP()").replace(
        "    x = torch.randn(32, 64)\n", f"    x = torch.randn(32, 64)\n    time.sleep({sleep_s})\n"))
    # the tune's first trial: 2 warm-up steps (the second counted), stopped once limit_s old
    result = run_doctor(DoctorConfig(command=["python", "train.py"], steps=None, warmup_steps=2, max_seconds=limit_s,
                                     out=tmp_path / "run", system_sampler=False))
    assert result.steps >= 5, result.traceback
    flops = [e["data"] for e in map(json.loads, (tmp_path / "run" / "events.jsonl").read_text().splitlines())
             if e["type"] == "flops"]
    if counted:
        assert len(flops) == 1 and flops[0]["flops_per_step"] > 0, flops
    else:  # 0.6 s steps: 3 more of them would end past 1.5 s
        assert flops == [{"flops_per_step": None, "skipped": flop_window.TOO_SLOW}], flops
        assert result.summary["mfu"]["note"] == flop_window.TOO_SLOW
