"""A model trained in float64 (pytorch/examples' time_sequence_prediction: `seq.double()`): the
doctor reported it as "fp32", took MFU against the fp32 peak and advised bf16 autocast, which
leaves float64 ops as they are. Now the run's precision is fp64, its MFU is against the float64
peak (measured on a CPU, the datasheet's on a GPU), and fp64_model says what to change."""

from __future__ import annotations

import pytest

from trainspeed.doctor.checks import fp64
from trainspeed.doctor.run_facts import script_precision_of
from trainspeed.doctor.runner import DoctorConfig, run_doctor
from trainspeed.patches.targets import Targets
from trainspeed.telemetry.peaks import dtype_for_precision, lookup_peak
from trainspeed.tune.knobs import DeviceInfo, Skip
from trainspeed.tune.script_facts import ScriptFacts
from trainspeed.tune.script_knobs import SCRIPT_KNOBS, ScriptContext

from tests.doctor.test_checks import CUDA_DEVICE, ctx_of, make_run

pytestmark = pytest.mark.timeout(120)

# Steps of ~1 ms of float64 matmuls: at 64x64 (0.1 ms) the Python between the steps held as much
# of the step as the compute, and beside a busy loop the where-time-goes line read it as overhead.
SCRIPT = '''
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 1)).double()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(512, 256, dtype=torch.double), torch.randn(512, 1, dtype=torch.double)
for step in range(30):
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def test_the_peak_table_and_precision_names_know_float64():
    assert lookup_peak("NVIDIA H100 80GB HBM3", "fp64").flops == pytest.approx(67e12)
    assert lookup_peak("NVIDIA A100-SXM4-40GB", "fp64").flops == pytest.approx(19.5e12)
    assert lookup_peak("NVIDIA L4", "fp64") is None  # no FP64 figure on its datasheet
    assert dtype_for_precision("fp64") == "fp64" and dtype_for_precision("64-true") == "fp64"
    model = {"kind": "model", "class": "Seq", "param_dtype": "float64", "autocast": "bfloat16"}
    # autocast around a float64 model changes nothing: the parameters' dtype is the precision
    assert script_precision_of([model]) == ("fp64", "the model's parameters")


def test_a_float64_script_is_reported_as_fp64_with_its_own_peak(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT)
    result = run_doctor(DoctorConfig(command=["python", "train.py"], out=tmp_path / "run", system_sampler=False,
                                     steps=20))
    summary = result.summary
    assert summary["precision"] == "fp64"
    assert summary["mfu"]["peak_name"].endswith("fp64 (measured)"), summary["mfu"]
    found = {f["id"]: f for f in result.findings}
    f = found["fp64_model"]
    assert f["severity"] == "warning" and "Sequential: parameters float64 on cpu" in f["evidence"]
    assert "`.float()` in place of `.double()`" in f["recommendation"]
    assert f["verify_with"].startswith("trainspeed doctor --steps 20 -- python train.py")
    compute = summary["phases"]["forward"]["share"] + summary["phases"]["backward"]["share"]
    assert f["impact"] == pytest.approx(compute * fp64.SIMD_FP64_SHARE, abs=0.01) and f["impact_estimated"]
    # the tune reads the run's phase shares (what a what-if could win at most) from its report
    from trainspeed.tune.script_facts import read_facts

    shares = read_facts(result.run_dir).phase_shares
    assert shares["forward"] == pytest.approx(summary["phases"]["forward"]["share"]) and "log" in shares
    # nothing advises bf16 autocast on it, or measures it
    import json

    goes = json.loads((result.run_dir / "report.json").read_text())["time_goes"]
    assert "float32 in place of float64" in goes["helps"][0] and "precision" not in (goes["verify_with"] or "")
    for other in result.findings:
        assert "bf16 autocast" not in other["recommendation"] or other["id"] == "fp64_model", other


def test_on_a_gpu_the_stake_is_the_datasheets_float64_to_tf32_ratio():
    # TF32 off: float32 still opens it, and FP64's tensor cores match plain FP32 on an H100
    h100 = {**CUDA_DEVICE, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "tf32_matmul": False}
    model = {"kind": "model", "class": "Seq", "param_dtype": "float64", "params": 10, "device": "cuda"}
    ctx = ctx_of(make_run(device="cuda", obs=[h100, model], shares={"forward": 0.3, "backward": 0.5}))
    f = fp64.fp64_model(ctx)
    assert f.impact == pytest.approx(0.8 * (1 - 67 / 494.7), abs=0.01)
    assert "fp64/tf32 peak 0.14 on NVIDIA H100 SXM" in f.basis
    unknown = ctx_of(make_run(device="cuda", obs=[{**h100, "name": "NVIDIA L4"}, model]))
    assert fp64.fp64_model(unknown).impact == 0.0  # no FP64 figure: nothing derived, said so
    assert fp64.fp64_model(ctx_of(make_run(device="cuda", obs=[h100, {**model, "param_dtype": "float32"}]))) is None


def test_the_tune_does_not_try_autocast_on_a_float64_model():
    facts = ScriptFacts(targets=Targets(model_class="Seq"), model={"class": "Seq", "param_dtype": "float64"})
    [skip] = SCRIPT_KNOBS["precision"](ScriptContext(facts=facts, device=DeviceInfo(type="cpu", cores=2,
                                                                                    has_compiler=True)))
    assert isinstance(skip, Skip) and "float64, which autocast leaves as it is" in skip.reason
