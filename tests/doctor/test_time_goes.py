"""Every report opens with where the step's time goes (checks/bound.py): data-, overhead- or
compute-bound, and what can still help there. An image classifier compute-bound on a CPU
(backward 46 %, forward 33 %, data 10 %) got 'num_workers=0 ~10 %' first and nothing said that
compute dominates."""
from __future__ import annotations

import json

import pytest

from test_checks import ctx_of, make_run
from test_loop_kinds import TRANSFORM_DATASET, doctor_code  # noqa: F401 - a fixture
from trainspeed.doctor.checks.bound import format_time_goes, where_time_goes

pytestmark = pytest.mark.timeout(120)

CONV = {"kind": "model", "class": "ResNet", "params": 11_000_000, "compiled": False, "convolutional": True,
        "trained_by": ["optimizer"]}


def test_a_compute_bound_cpu_run_says_so_and_what_can_still_help():
    run = make_run(shares={"backward": 0.46, "forward": 0.33, "data": 0.10, "optimizer": 0.02},
                   obs=[CONV, {"kind": "dataloader", "role": "train", "num_workers": 0, "cores": 2}])
    found = where_time_goes(ctx_of(run))
    assert found["bound"] == "compute" and found["shares"]["compute"] == pytest.approx(0.81, abs=0.01)
    assert found["statement"].startswith("compute-bound: 81% of the step is the model's forward, backward")
    assert "data 10% (data 10%)" in found["statement"]
    assert "outside module calls" not in found["statement"]  # its forwards were seen: other is other
    helps = " ".join(found["helps"])
    assert "torch.compile" in helps and "channels_last" in helps and "bf16" in helps
    assert "Where the time goes: compute-bound" in format_time_goes(found)


def test_a_data_bound_run_points_at_the_loader():
    run = make_run(shares={"data": 0.7, "forward": 0.1, "backward": 0.15},
                   obs=[{"kind": "dataloader", "role": "train", "num_workers": 0, "cores": 8}])
    found = where_time_goes(ctx_of(run))
    assert found["bound"] == "data" and "DataLoader workers (now 0, 8 cores)" in found["helps"][0]


def test_a_gpu_run_far_below_its_peak_is_launch_overhead_not_compute():
    run = make_run(shares={"forward": 0.4, "backward": 0.5}, device="cuda",
                   obs=[{"kind": "device", "type": "cuda"}])
    summary_mfu = {"value": 0.01, "valid": True, "peak_name": "H100 bf16"}
    from trainspeed.doctor.checks.context import CheckContext
    from trainspeed.telemetry.summary import summarize

    summary = {**summarize(run), "mfu": summary_mfu}
    found = where_time_goes(CheckContext.from_run(run, summary))
    assert found["bound"] == "overhead" and "launching small GPU kernels" in found["statement"]
    assert any("larger batch" in h for h in found["helps"])


def test_the_doctor_writes_it_and_the_report_opens_with_it(doctor_code, capsys):
    from trainspeed.report import render_run

    result = doctor_code(TRANSFORM_DATASET)
    report = json.loads((result.run_dir / "report.json").read_text())
    assert report["time_goes"]["bound"] == "data", report["time_goes"]
    render_run(result.run_dir, html=False)
    out = capsys.readouterr().out
    body = out[out.index("trainspeed report"):]
    assert body.index("Where the time goes: data-bound") < body.index("Findings")


def test_a_compute_bound_run_that_waits_for_its_data_measures_the_workers_first():
    """pytorch/examples' mnist on the CPU: compute 86 %, and 13 % of the step waiting for the next
    batch (num_workers=0). Its one warning was the data wait, and the top offered bf16 and compile
    with `Measure it: trainspeed tune --knobs precision,compile`."""
    run = make_run(shares={"forward": 0.43, "backward": 0.37, "optimizer": 0.06, "data": 0.13},
                   obs=[CONV, {"kind": "dataloader", "role": "train", "num_workers": 0, "cores": 2}])
    found = where_time_goes(ctx_of(run))
    assert found["bound"] == "compute"
    assert found["helps"][0].startswith("DataLoader workers (now 0) for the 13% of the step spent waiting")
    assert "--knobs num_workers,precision,compile" in found["verify_with"], found["verify_with"]
    below = make_run(shares={"forward": 0.43, "backward": 0.37, "optimizer": 0.06, "data": 0.08},
                     obs=[CONV, {"kind": "dataloader", "role": "train", "num_workers": 0, "cores": 2}])
    quiet = where_time_goes(ctx_of(below))  # under the data finding's warning: the top stays on compute
    assert not quiet["helps"][0].startswith("DataLoader") and "num_workers" not in quiet["verify_with"]


def test_a_run_without_a_dataloader_is_offered_no_workers():
    """pytorch/examples' regression builds each batch itself (no DataLoader): its top offered
    "DataLoader workers for the 14% of the step spent waiting" and `Measure it: trainspeed tune
    --knobs num_workers`, which refused to run (exit 3: no DataLoader, no workers to add)."""
    waits = make_run(shares={"forward": 0.43, "backward": 0.37, "optimizer": 0.06, "data": 0.14}, obs=[CONV])
    found = where_time_goes(ctx_of(waits))
    assert not any("DataLoader" in h for h in found["helps"]), found["helps"]
    assert "num_workers" not in (found["verify_with"] or ""), found["verify_with"]
    starved = make_run(shares={"forward": 0.1, "backward": 0.1, "optimizer": 0.05, "data": 0.75}, obs=[CONV])
    found = where_time_goes(ctx_of(starved))
    assert found["bound"] == "data" and "num_workers" not in (found["verify_with"] or ""), found["verify_with"]


def test_a_compute_bound_run_with_a_loop_optimizer_measures_the_fused_one_too():
    """A newcomer's MLP: the optimizer step was 25 % of the step (AdamW's per-parameter loop on a
    CPU) and its finding said so, while the top's "Measure it" named precision and compile only,
    and read "at 20% of cpu (2 threads) fp32 (measured)" for 20 % of that peak."""
    adamw = {"kind": "optimizer", "primary": True, "class": "AdamW", "module": "torch.optim.adamw", "fused": None,
             "foreach": None, "implementations": ["fused", "foreach"], "devices": ["cpu"], "params": 400_000}
    run = make_run(shares={"forward": 0.21, "backward": 0.29, "optimizer": 0.25, "data": 0.02},
                   obs=[{**CONV, "convolutional": False}, adamw])
    from trainspeed.doctor.checks.context import CheckContext
    from trainspeed.telemetry.summary import summarize

    summary = {**summarize(run), "mfu": {"value": 0.2, "valid": True, "peak_name": "cpu (2 threads) fp32 (measured)"}}
    found = where_time_goes(CheckContext.from_run(run, summary))
    assert found["bound"] == "compute"
    assert "at 20% of the peak (cpu (2 threads) fp32 (measured))" in found["statement"], found["statement"]
    assert any(h.startswith("a fused optimizer step (the optimizer is 25% of the step") for h in found["helps"])
    assert found["verify_with"].endswith("--knobs precision,compile,fused_optimizer"), found["verify_with"]
    fused = make_run(shares={"forward": 0.21, "backward": 0.29, "optimizer": 0.25, "data": 0.02},
                     obs=[{**CONV, "convolutional": False}, {**adamw, "fused": True}])
    assert "fused_optimizer" not in where_time_goes(ctx_of(fused))["verify_with"]
