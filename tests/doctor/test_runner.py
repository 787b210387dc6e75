from __future__ import annotations

import sys

import pytest

from trainspeed.doctor.runner import DoctorConfig, Target, execute, exit_code_of, parse_command
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def test_parse_command_forms(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # python -m finds pkg.train from the cwd
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("")
    script = tmp_path / "train.py"
    script.write_text("")
    assert parse_command(["python", str(script), "--lr", "3"]) == Target("path", str(script), ["--lr", "3"])
    assert parse_command(["--", "python3.11", "-u", "-W", "ignore", str(script)]) == Target("path", str(script), [])
    assert parse_command([str(script), "a"]) == Target("path", str(script), ["a"])
    assert parse_command([sys.executable, "-m", "pkg.train", "--x"]) == Target("module", "pkg.train", ["--x"])


@pytest.mark.parametrize("command, match", [
    ([], "no command"), (["python"], "names no script"), (["python", "-m"], "module name"),
    (["python", "-c", "print(1)"], "not supported"), (["python", "nope.py"], "not found"),
])
def test_parse_command_errors(command, match):
    with pytest.raises(ConfigError, match=match):
        parse_command(command)


@pytest.mark.parametrize("module", ["nosuchmod", "pkg.nosuch", "pkg.train.deeper"])
def test_a_module_python_m_cannot_find_is_a_usage_error(tmp_path, monkeypatch, module):
    """`-m nosuchmod` ran, crashed in runpy with trainspeed's frames, and advised `pip install
    nosuchmod`; now it is refused up front like a script path that is not there."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('not imported by the lookup')\n")
    (tmp_path / "pkg" / "train.py").write_text("")
    with pytest.raises(ConfigError, match=f"module '{module}' not found"):
        parse_command(["python", "-m", module])
    assert parse_command(["python", "-m", "pkg.train"]).name == "pkg.train"  # found, __init__ not run
    assert parse_command(["python", "-m", "json.tool"]).name == "json.tool"  # installed ones too


def test_config_validation():
    with pytest.raises(ConfigError, match="doctor.steps"):
        DoctorConfig(command=["x.py"], steps=0)
    with pytest.raises(ConfigError, match="doctor.device"):
        DoctorConfig(command=["x.py"], device="tpu")


@pytest.mark.parametrize("code, status", [(None, 0), (0, 0), (3, 3), (True, 1), ("bye", 1), (-1, 255), (256, 0)])
def test_exit_code_of_matches_python(code, status):
    assert exit_code_of(SystemExit(code)) == status


def test_execute_sets_argv_main_and_path_then_restores(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys, helper_mod\n"
        "RESULT.update(argv=list(sys.argv), name=__name__, path0=sys.path[0], helper=helper_mod.X)\n")
    (tmp_path / "helper_mod.py").write_text("X = 7\n")
    result: dict = {}
    import builtins
    builtins.RESULT = result
    argv, path = sys.argv[:], sys.path[:]
    try:
        execute(Target("path", str(script), ["--a", "1"]))
    finally:
        del builtins.RESULT
        sys.modules.pop("helper_mod", None)
    assert result == {"argv": [str(script), "--a", "1"], "name": "__main__", "path0": str(tmp_path), "helper": 7}
    assert sys.argv == argv and sys.path == path


def test_doctor_records_the_datasheet_peak_of_a_known_gpu(monkeypatch):
    """On CUDA the summary's MFU needs a peak_flops event: looked up from the table for the
    dtype the script's matmuls ran at (no GPU here: the device name is faked)."""
    import torch

    from trainspeed.doctor.runner import matmul_dtype, record_peak

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    events = []

    class Recorder:
        def event(self, type_, **data):
            events.append((type_, data))

    models = [{"kind": "model", "autocast": "bfloat16", "param_dtype": "float32"}]
    assert matmul_dtype(models, "cuda") == "bf16"
    assert matmul_dtype([{"kind": "model", "autocast": None, "param_dtype": "float16"}], "cuda") == "fp16"
    assert matmul_dtype([{"kind": "batch"}], "cpu") == "fp32"
    record_peak(Recorder(), models, "cuda")
    (kind, data), = events
    assert kind == "peak_flops" and data["dtype"] == "bf16" and data["source"] != "measured"
    assert 900e12 < data["flops"] < 1100e12  # H100 SXM dense bf16 ~989 TFLOP/s
    events.clear()
    # A CPU in fp32: a measured matmul peak (cheap), named after the threads it ran on.
    record_peak(Recorder(), [], "cpu")
    (kind, data), = events
    assert kind == "peak_flops" and data["source"] == "measured" and data["dtype"] == "fp32"
    assert data["flops"] > 1e8 and data["name"].startswith("cpu (")
    # bf16 on a CPU without bf16 units is not measured after the script (emulated, it can take
    # seconds); with them, see the next test.
    events.clear()
    monkeypatch.setattr("trainspeed.telemetry.cpu_facts.cpu_flags", lambda: {"avx512_bf16": False, "amx_bf16": False})
    record_peak(Recorder(), models, "cpu")
    assert events == []



def test_a_cpu_bf16_run_gets_a_measured_peak_only_where_the_cpu_has_bf16_units(monkeypatch, tmp_path):
    # nanoGPT with a bf16 autocast read "MFU not measured" on an EPYC with avx512_bf16, whose
    # bf16 matmul reaches ~850 GFLOP/s; without the units a bf16 matmul is emulated (seconds)
    from trainspeed.doctor.runner import record_peak
    from trainspeed.telemetry import peaks

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    peaks._measured.cache_clear()
    timed = []
    monkeypatch.setattr(peaks, "_time_matmul", lambda dev, dtype: timed.append(dtype) or (850e9, True))
    events = []

    class Recorder:
        def event(self, type_, **data):
            events.append((type_, data))

    models = [{"kind": "model", "autocast": "bfloat16", "param_dtype": "float32"}]
    flags = {"avx512_bf16": False, "amx_bf16": False, "avx512f": True, "avx2": True}
    monkeypatch.setattr("trainspeed.telemetry.cpu_facts.cpu_flags", lambda: flags)
    record_peak(Recorder(), models, "cpu")
    assert events == [] and timed == []
    flags["avx512_bf16"] = True
    record_peak(Recorder(), models, "cpu")
    (kind, data), = events
    assert (kind, data["dtype"], data["flops"], timed) == ("peak_flops", "bf16", 850e9, ["bf16"])
    peaks._measured.cache_clear()


AUTOCAST_SCRIPT = """
import torch
from torch import nn

model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(12):
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_script_that_autocasts_is_reported_in_its_precision(tmp_path):
    # nanoGPT with the tune's bf16 autocast patched in ran 1.28x faster and was reported "fp32"
    from trainspeed.doctor.runner import run_doctor, script_precision_of

    script = tmp_path / "train.py"
    script.write_text(AUTOCAST_SCRIPT)
    result = run_doctor(DoctorConfig(command=[sys.executable, str(script)], steps=10, out=tmp_path / "run"))
    assert result.exit_code == 0 and result.summary["precision"] == "bf16-mixed"
    assert script_precision_of([{"kind": "model", "autocast": None, "param_dtype": "float32"}]) is None
    assert script_precision_of([{"kind": "model", "autocast": None, "param_dtype": "bfloat16"}]) == \
        ("bf16", "the model's parameters")
    plain = tmp_path / "plain.py"
    plain.write_text(AUTOCAST_SCRIPT.replace('with torch.autocast(device_type="cpu", dtype=torch.bfloat16):',
                                             "if True:"))
    result = run_doctor(DoctorConfig(command=[sys.executable, str(plain)], steps=10, out=tmp_path / "run2"))
    assert result.exit_code == 0 and result.summary["precision"] == "fp32"
