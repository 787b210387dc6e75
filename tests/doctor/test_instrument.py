"""Hook behaviour on small inline scripts (CPU): phases, eval, accumulation, transfers,
loggers, DataParallel, torch internals, and the StopDoctor contract."""
from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from doctor_helpers import ids, observations, run_inline
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.syncs import counts_as_sync

pytestmark = pytest.mark.timeout(120)

PRELUDE = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(4, 8), torch.randn(4, 1)
"""


@pytest.fixture
def doctor_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def run(body: str, steps: int | None = 20, name: str = "train.py"):
        return run_inline(tmp_path, PRELUDE + textwrap.dedent(body), steps, name)

    return run


_observations = observations


def test_accumulation_factor_and_info_finding(doctor_code):
    result = doctor_code("""
        for step in range(100):
            for micro in range(4):
                (nn.functional.mse_loss(model(x), y) / 4).backward()
            opt.step()
            opt.zero_grad()
    """)
    assert _observations(result, "accumulation")[0]["factor"] == 4
    finding = next(f for f in result.findings if f["id"] == "accumulation_for_speed")
    assert finding["severity"] == "info" and "4 backward passes" in finding["evidence"]


def test_stop_is_not_swallowed_by_except_exception(doctor_code):
    result = doctor_code("""
        for step in range(1000):
            try:
                nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            except Exception:
                pass
        raise SystemExit(5)  # never reached: the doctor stops the loop
    """, steps=7)
    assert (result.stopped, result.steps, result.exit_code) == ("steps", 7, 0)


def test_eval_is_sticky_and_no_grad_loader_wait_is_eval(doctor_code):
    result = doctor_code("""
        import time
        from torch.utils.data import DataLoader, TensorDataset
        val = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16)
        for step in range(100):
            nn.functional.mse_loss(model(x), y).backward()
            opt.step(); opt.zero_grad()
            with torch.no_grad():
                for (vx,) in val:
                    model(vx)
                time.sleep(0.002)  # metric bookkeeping inside the eval block
    """)
    phases = result.summary["phases"]
    assert phases["eval"]["share"] > 0.3
    assert phases["data"]["share"] == pytest.approx(0.0, abs=1e-3)
    assert phases["forward"]["share"] > 0


def test_batch_copies_to_another_device_are_h2d(doctor_code):
    # "meta" is a real second device on CPU-only machines: the copy path runs unchanged
    result = doctor_code("""
        for step in range(100):
            x.to("meta", non_blocking=True)
            x.to(torch.float64)  # dtype-only: not a copy to a device
            nn.functional.mse_loss(model(x), y).backward()
            opt.step(); opt.zero_grad()
    """)
    transfers = _observations(result, "transfers")[0]
    assert transfers["count"] == 20 and transfers["non_blocking"] == 20
    assert result.summary["phases"]["h2d"]["mean_s"] > 0


def test_torch_internal_reads_are_not_syncs_but_user_reads_are(doctor_code):
    # single-tensor Adam on CPU calls .item() on its step counters inside torch.optim
    result = doctor_code("""
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
        for step in range(100):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step(); opt.zero_grad()
            if step % 2 == 0:
                bool(loss > 100)
    """)
    assert result.summary["syncs_per_step"] == pytest.approx(0.5, abs=0.1)
    rows = _observations(result, "call_sites")[0]["rows"]
    assert [r["kind"] for r in rows if r["category"] == "sync"] == ["bool"]
    lines = (result.run_dir.parent / "train.py").read_text().splitlines()
    line = next(n for n, text in enumerate(lines, 1) if "bool(loss > 100)" in text)
    assert rows[0]["site"].endswith(f"train.py:{line}")


def test_wandb_and_print_logging_are_the_log_phase(doctor_code, tmp_path, monkeypatch):
    (tmp_path / "wandb.py").write_text("import time\ndef log(d, step=None):\n    time.sleep(0.003)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # setitem first: its undo removes the fake `wandb` the script imports (delitem alone restores
    # nothing when wandb was not imported before), so later tests see the real package.
    monkeypatch.setitem(sys.modules, "wandb", None)
    monkeypatch.delitem(sys.modules, "wandb")
    result = doctor_code("""
        import wandb
        for step in range(100):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step(); opt.zero_grad()
            wandb.log({"loss": 1.0}, step=step)
    """)
    import wandb  # the fake module, imported by the script

    assert not hasattr(wandb.log, "__wrapped__")  # unpatched after the run
    assert _observations(result, "logger")[0]["library"] == "wandb"
    assert ids(result)[0] == "logging_overhead"
    assert "wandb.log" in result.findings[0]["evidence"]


def test_data_parallel_is_flagged(doctor_code):
    result = doctor_code("""
        dp = nn.DataParallel(model)
        for step in range(100):
            nn.functional.mse_loss(dp(x), y).backward()
            opt.step(); opt.zero_grad()
    """)
    assert "data_parallel" in ids(result)
    assert _observations(result, "model")[0]["data_parallel"] is True


def test_flops_of_one_real_step_are_counted(doctor_code):
    result = doctor_code("""
        for step in range(100):
            nn.functional.mse_loss(model(x), y).backward()
            opt.step(); opt.zero_grad()
    """)
    # forward 2*4*(8*16 + 16*1); backward: weight grads for both layers, input grad for the 2nd
    forward = 2 * 4 * (8 * 16 + 16 * 1)
    assert result.summary["flops_per_step"] == pytest.approx(forward + forward + 2 * 4 * 16 * 1)


class _FakeMon:
    steps_done = 0


def test_counts_as_sync_rules():
    s = Session(_FakeMon(), max_steps=None)
    try:
        t = torch.ones(2)
        assert counts_as_sync(s, t)  # CPU run: a computed value counts (it would sync on a GPU)
        s.batch_ids.add(id(t))
        assert not counts_as_sync(s, t)  # the loader's own batch tensors do not
        s.accelerator = "cuda"
        assert not counts_as_sync(s, torch.ones(2))  # GPU run: CPU tensors wait for nothing
        assert not counts_as_sync(s, torch.ones(2, device="meta"))
    finally:
        s.close()


def test_autocast_wrapped_into_the_instance_forward_is_the_models_precision():
    # accelerate's mixed precision (a Trainer with --bf16 True: transformers' run_clm.py) sets
    # model.forward = MethodType(ConvertOutputsToFp32(torch.autocast(...)(forward)), model):
    # autocast starts inside the call, after the pre-hook, and the run was reported "fp32".
    import functools
    from types import MethodType

    from torch import nn

    from trainspeed.doctor.instrument.module import describe_module, forward_autocast

    class ConvertOutputs:  # accelerate.utils.operations.ConvertOutputsToFp32's shape
        def __init__(self, model_forward):
            self.model_forward = model_forward
            functools.update_wrapper(self, model_forward)

        def __call__(self, *args, **kwargs):
            return self.model_forward(*args, **kwargs)

    def convert_outputs(model_forward):  # accelerate.utils.operations.convert_outputs_to_fp32
        model_forward = ConvertOutputs(model_forward)

        def forward(*args, **kwargs):
            return model_forward(*args, **kwargs)

        forward.__wrapped__ = model_forward
        return forward

    def decorated(fn, depth):  # transformers' forward decorators (can_return_tuple ...), deep
        for _ in range(depth):
            fn = functools.wraps(fn)(lambda *a, _f=fn, **k: _f(*a, **k))
        return fn

    model = nn.Linear(4, 4)
    assert forward_autocast(model) is None and describe_module(model)["autocast"] is None
    wrapped = torch.autocast(device_type="cpu", dtype=torch.bfloat16)(decorated(nn.Linear.forward, 12))
    model.forward = MethodType(wrapped, model)
    model.forward = MethodType(convert_outputs(model.forward.__func__), model)
    assert describe_module(model)["autocast"] == "bfloat16"
    assert model(torch.ones(2, 4)).dtype == torch.bfloat16  # the shape is a working forward
    off = nn.Linear(4, 4)
    off.forward = torch.autocast(device_type="cpu", enabled=False)(off.forward)
    assert forward_autocast(off) is None


def test_a_fabric_module_in_mixed_precision_is_the_models_precision():
    # Fabric(precision="bf16-mixed") autocasts inside _FabricModule.forward, after the pre-hook:
    # Lightning's examples/fabric/language_model/train.py with the tune's patch ran 1.9-2.1x
    # faster and was reported "fp32"
    pytest.importorskip("lightning")
    import lightning as L

    from trainspeed.doctor.instrument.module import describe_module

    for precision, dtype in (("bf16-mixed", "bfloat16"), ("32-true", None)):
        model = L.Fabric(accelerator="cpu", devices=1, precision=precision).setup(torch.nn.Linear(4, 2))
        assert describe_module(model)["autocast"] == dtype, precision
