"""GPU figures from the measured steps and shares at stake derived from the run, with their
basis named (issue 29): synthetic CUDA run directories (sampler rows, step records, observations),
no GPU needed. Each figure is checked on numbers."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainspeed.doctor.checks import CheckContext, diagnose, hardware, syncs
from trainspeed.doctor.findings import rank
from trainspeed.report.fmt import rank_findings
from trainspeed.telemetry.gpu_busy import busy_window, gpu_busy
from trainspeed.telemetry.rundir import RunData
from trainspeed.telemetry.schema import PHASES, make_event
from trainspeed.telemetry.stakes import counted_total, mark_overlaps
from trainspeed.telemetry.summary import summarize

pytestmark = pytest.mark.timeout(60)

H100 = {"kind": "device", "type": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": "9.0",
        "total_memory": 80 * 2**30, "tf32_matmul": False, "float32_matmul_precision": "highest",
        "bf16_supported": True}
FP32_MODEL = {"kind": "model", "class": "MLP", "params": 10**8, "param_dtype": "float32", "device": "cuda",
              "compiled": False, "autocast": None}
T0 = 1000.0  # wall clock of the process start; the steps start 20 s later (imports, CUDA, model)


def cuda_run(*, n=40, step=0.1, shares=None, util_before=0.0, util_during=90.0, flops=None,
             peak=None, obs=(H100, FP32_MODEL), sync_sites=None, syncs_per_step=0) -> RunData:
    """A CUDA run: 20 s of start-up at `util_before` % NVML, then n steps of `step` s at
    `util_during` %, sampled every 0.25 s."""
    shares = shares or {"forward": 0.3, "backward": 0.6}
    steps, t = [], T0 + 20.0
    for i in range(1, n + 1):
        t += step
        phases = {p: step * shares.get(p, 0.0) for p in PHASES}
        phases["other"] = max(0.0, step - sum(phases.values()))
        steps.append({"schema": 1, "step": i, "t_wall": t, "t_step": step, "phases": phases, "samples": 8,
                      "tokens": 1024, "syncs": syncs_per_step, "warmup": i <= 2, "mem": {}})
    ts = [T0 + 0.25 * k for k in range(1, int((t - T0) / 0.25) + 1)]
    util = [util_before if x <= T0 + 20.0 + 2 * step else util_during for x in ts]
    mean = sum(util) / len(util)
    evs = [make_event("run_start", 0, T0, device="cuda:0", precision="fp32",
                      **({"flops_per_step": flops} if flops else {}))]
    evs += [make_event("observation", 0, T0, **o) for o in obs]
    if sync_sites:
        evs.append(make_event("observation", 0, T0, **sync_sites))
    evs.append(make_event("system", n, t, gpu_util_mean=mean,
                          series={"t": ts, "gpu_util": util, "cpu_tree": [None] * len(ts),
                                  "cpu_others": [None] * len(ts), "rss": [None] * len(ts),
                                  "children_rss": [None] * len(ts)}))
    env = {"peak_flops": peak} if peak else {}
    return RunData(path=Path("."), env=env, steps=steps, events=evs)


def ctx_of(run):
    return CheckContext.from_run(run, summarize(run))


FP32_PEAK = {"name": "NVIDIA H100 SXM", "dtype": "fp32", "flops": 67e12, "source": "table"}


def test_gpu_busy_is_read_over_the_measured_steps_not_the_process():
    """The H100 story: 20 s of start-up at 0 % and the steps at 90 %: over the process NVML
    reads ~15 %; over the measured steps 90 %, and no 'mostly idle' finding."""
    run = cuda_run()
    summary = summarize(run)
    assert summary["gpu_busy"]["value"] == pytest.approx(0.90, abs=0.01)
    assert summary["gpu_busy"]["valid"] and summary["gpu_busy"]["samples"] >= 10
    assert (run.events_of("system")[0]["data"]["gpu_util_mean"]) < 20  # what the old check read
    assert "low_gpu_utilization" not in [f["id"] for f in diagnose(run)]


def test_gpu_busy_below_the_mfu_is_not_a_figure_of_the_steps():
    """'GPU busy 2 %' beside 'MFU 8 %' cannot both describe the steps: the busy reading is
    rejected, and no idle finding is made from it."""
    flops = 0.08 * 67e12 * 0.1  # MFU 8 % of the fp32 peak at 0.1 s a step
    run = cuda_run(util_during=2.0, flops=flops, peak=FP32_PEAK)
    summary = summarize(run)
    assert summary["mfu"]["value"] == pytest.approx(0.08, rel=0.01)
    assert summary["gpu_busy"]["valid"] is False and "MFU" in summary["gpu_busy"]["note"]
    assert hardware.low_gpu_utilization(ctx_of(run)) is None


def test_busy_window_and_too_few_samples():
    assert busy_window([10.0, 11.0], [1.0, 1.0], [True, True]) == (9.0, 11.0)
    one = gpu_busy((9.0, 11.0), [8.0, 10.0], [0.0, 50.0])
    assert one["samples"] == 1 and one["valid"] is False
    assert gpu_busy((9.0, 11.0), [8.0, 10.0], [float("nan")] * 2) is None


@pytest.mark.parametrize("mfu, expected", [(0.65, 0.65 * (1 - 67 / 989.4)), (0.001, 0.001 * (1 - 67 / 989.4))])
def test_fp32_stake_is_the_matmul_share_times_the_peak_ratio(mfu, expected):
    """At MFU 65 % of the fp32 peak the matmuls take at least 65 % of the step, and bf16 runs
    them at 67/989 of that time: ~61 % at stake. At MFU 0.1 % (a data-bound run) ~0.1 %, not a
    fixed 40 %."""
    run = cuda_run(flops=mfu * 67e12 * 0.1, peak=FP32_PEAK, shares={"forward": 0.33, "backward": 0.66})
    f = hardware.fp32_on_tensor_cores(ctx_of(run))
    assert f.impact == pytest.approx(expected, rel=0.02) and not f.impact_estimated
    assert "matmuls take at least" in f.basis and "fp32/bf16" in f.basis


def test_fp32_stake_without_a_flop_count_is_an_upper_bound_labelled_estimated():
    run = cuda_run(shares={"forward": 0.2, "backward": 0.4})
    f = hardware.fp32_on_tensor_cores(ctx_of(run))
    assert f.impact == pytest.approx(0.6 * (1 - 67 / 989.4), rel=0.02) and f.impact_estimated
    tf32 = cuda_run(shares={"forward": 0.2, "backward": 0.4}, obs=({**H100, "tf32_matmul": True}, FP32_MODEL))
    # with TF32 on, the fp32 matmuls already run at 494.7 TFLOP/s: half at stake
    assert hardware.fp32_on_tensor_cores(ctx_of(tf32)).impact == pytest.approx(0.6 * 0.5, rel=0.02)


def _item_sites(count, seconds):
    return {"kind": "call_sites", "rows": [{"category": "sync", "kind": "item", "site": "train.py:9", "code": "x",
                                            "count": count, "seconds": seconds}],
            "totals": {"sync": {"item": {"count": count, "seconds": seconds}}}}


def test_sync_stake_is_the_wait_inside_the_reads_and_the_idle_rest_is_the_hosts():
    """A read per step taking 5 % of the time, GPU busy 55 %, no data wait. Dropping the reads
    wins at most their wait (the host's own work stays, and the step is at least that): 5 %,
    not the 45 % idle. The other 40 % idle is the host's work: the launch-bound finding's.
    (On an H100, item_sync.py's idle put 69 % on the reads; reading every 10 steps: 0.96x.)"""
    run = cuda_run(util_during=55.0, sync_sites=_item_sites(40, 0.2), syncs_per_step=1)
    f = syncs.host_syncs(ctx_of(run))
    assert f.impact == pytest.approx(0.05, abs=0.005) and "wait inside the reads" in f.basis
    assert "the reads do not cause" in f.basis
    idle = hardware.low_gpu_utilization(ctx_of(run))
    assert idle is not None and idle.impact == pytest.approx(0.40, abs=0.02)
    ranked = [x["id"] for x in diagnose(run)]
    assert ranked.index("low_gpu_utilization") < ranked.index("host_syncs")
    # a read that waits long: its wait is at stake, and it ranks above what idle is left
    long_wait = cuda_run(util_during=55.0, sync_sites=_item_sites(40, 1.6), syncs_per_step=1)
    f = syncs.host_syncs(ctx_of(long_wait))
    assert f.impact == pytest.approx(0.40, abs=0.02) and "also idles" not in f.basis
    # without a busy figure: the same wait, 5 % of the time
    quiet = cuda_run(util_during=float("nan"), sync_sites=_item_sites(40, 0.2), syncs_per_step=1)
    assert syncs.host_syncs(ctx_of(quiet)).impact == pytest.approx(0.05, abs=0.005)


def test_idle_gpu_with_half_the_step_outside_the_phases_is_put_on_python_between_the_steps():
    """GPU busy 45 %, forward + backward 50 % of the step, the rest outside every phase (plain
    Python between the steps, as item_sync.py's bookkeeping): the idle time is the host's work
    between the steps, and the advice says to move it, not only to fuse kernels."""
    run = cuda_run(util_during=45.0, shares={"forward": 0.2, "backward": 0.3})
    f = hardware.low_gpu_utilization(ctx_of(run))
    assert f is not None and f.impact == pytest.approx(0.55, abs=0.02)
    assert "between the steps" in f.title and "50%" in f.evidence.replace(" ", "")
    assert f.recommendation.startswith("the host's Python work between the steps")
    launch = hardware.low_gpu_utilization(ctx_of(cuda_run(util_during=45.0)))
    assert "launch-bound" in launch.title and "between the steps" not in launch.recommendation


def test_data_bound_ranks_above_the_idle_gpu_it_explains():
    """GPU busy 30 %, data wait 60 %: the data wait explains 60 of the 70 % idle; the idle
    finding claims the other 10 %, below data_bound (it ranked first at 70 % before)."""
    loader = {"kind": "dataloader", "role": "train", "num_workers": 0, "pin_memory": False,
              "persistent_workers": False, "batch_size": 32, "cores": 8, "iters": 1, "iter_seconds": 0.0}
    run = cuda_run(util_during=30.0, shares={"data": 0.6, "forward": 0.1, "backward": 0.2},
                   obs=(H100, {**FP32_MODEL, "autocast": "bfloat16"}, loader))
    found = diagnose(run)
    ids = [f["id"] for f in found]
    assert ids[0] == "data_bound"
    idle = next(f for f in found if f["id"] == "low_gpu_utilization")
    assert idle["impact"] == pytest.approx(0.10, abs=0.02) and "launch" in idle["title"]
    assert sum(f["impact"] for f in found if not f["overlaps"]) <= 1.0


def test_shares_that_overlap_say_so_and_the_sum_stays_within_the_step():
    """41 + 98 + 40 + 5 + 5 = 189 % in one report: overlapping compute-side shares are marked,
    and a share that would pass 100 % is marked as overlapping those above."""
    found = [{"id": "low_gpu_utilization", "severity": "warning", "impact": 0.98},
             {"id": "data_bound", "severity": "critical", "impact": 0.41},
             {"id": "fp32_on_tensor_cores", "severity": "warning", "impact": 0.40},
             {"id": "padding_waste", "severity": "warning", "impact": 0.05},
             {"id": "host_syncs", "severity": "warning", "impact": 0.05}]
    ranked = rank(found)
    assert counted_total(ranked) <= 1.0
    marked = {f["id"]: f["overlaps"] for f in ranked}
    assert marked["low_gpu_utilization"] == []
    assert marked["data_bound"] and marked["fp32_on_tensor_cores"]
    assert marked["padding_waste"] == ["fp32_on_tensor_cores"]
    assert counted_total(mark_overlaps([{"id": "a", "impact": 0.3}, {"id": "b", "impact": 0.2}])) == pytest.approx(0.5)


def test_report_ranks_by_share_at_stake_like_the_doctor():
    """The report listed findings severity first: a critical with 5 % at stake above a
    warning with 60 %."""
    found = [{"id": "a", "severity": "critical", "impact": 0.05}, {"id": "b", "severity": "warning", "impact": 0.6}]
    assert [f["id"] for f in rank_findings(found)] == ["b", "a"]


def test_allocator_retries_on_every_step_claim_the_idle_gpu():
    """Memory near the limit: retries on every measured step, GPU busy 40 %, nothing else
    explains the idle 60 %: memory_near_oom claims it (it was a fixed 5 %), and the idle-GPU
    finding does not claim it again."""
    run = cuda_run(util_during=40.0, obs=(H100, {**FP32_MODEL, "autocast": "bfloat16"}))
    for rec in run.steps:
        rec["mem"] = {"cuda_alloc_peak": 70 * 2**30, "cuda_reserved_peak": 79 * 2**30,
                      "cuda_alloc_retries": rec["step"] * 3}
    found = {f["id"]: f for f in diagnose(run)}
    assert found["memory_near_oom"]["impact"] == pytest.approx(0.60, abs=0.02)
    assert "allocator retries" in found["memory_near_oom"]["basis"]
    assert "low_gpu_utilization" not in found
    assert next(iter(found)) == "memory_near_oom"


def test_cudnn_benchmark_off_on_a_conv_model():
    conv = {**FP32_MODEL, "autocast": "bfloat16", "convolutional": True}
    run = cuda_run(obs=({**H100, "cudnn_benchmark": False}, conv), shares={"forward": 0.3, "backward": 0.5})
    f = hardware.cudnn_benchmark_off(ctx_of(run))
    assert f.impact == pytest.approx(0.8, abs=0.01) and f.impact_estimated and "upper bound" in f.basis
    assert f.verify_with is None  # an engine-style run: no engine knob (a script run gets --knobs cudnn_benchmark)
    on = cuda_run(obs=({**H100, "cudnn_benchmark": True}, conv))
    assert hardware.cudnn_benchmark_off(ctx_of(on)) is None
    mlp = cuda_run(obs=({**H100, "cudnn_benchmark": False}, {**FP32_MODEL, "autocast": "bfloat16"}))
    assert hardware.cudnn_benchmark_off(ctx_of(mlp)) is None


def test_cudnn_benchmark_off_with_cudnn_9_is_a_thing_to_measure_not_a_warning():
    """On an H100 with cuDNN 9 the autotuner changed six conv nets by 1.00x, and the warning at
    '99 % at stake' ranked first on cudnn_off.py: from cuDNN 9 on it is info, nothing at stake,
    with the tune command that measures it."""
    conv = {**FP32_MODEL, "autocast": "bfloat16", "convolutional": True}
    run = dataclasses.replace(cuda_run(obs=({**H100, "cudnn_benchmark": False}, conv),
                                       shares={"forward": 0.3, "backward": 0.5}), env={"cudnn": 91002})
    f = hardware.cudnn_benchmark_off(ctx_of(run))
    assert f.severity == "info" and f.impact == 0.0 and "91002" in f.basis and "1.00x" in f.evidence
    assert not [x for x in diagnose(run) if x["severity"] in ("warning", "critical") and x["id"] == "cudnn_benchmark_off"]
    old = dataclasses.replace(run, env={"cudnn": 8902})
    assert hardware.cudnn_benchmark_off(ctx_of(old)).severity == "warning"


def test_report_shows_gpu_busy_of_the_measured_steps_and_why_not():
    from trainspeed.report.terminal import summary_lines

    rows = dict(summary_lines(summarize(cuda_run())))
    assert rows["GPU busy"].startswith("90") and "inside the measured steps" in rows["GPU busy"]
    low = dict(summary_lines(summarize(cuda_run(util_during=2.0, flops=0.08 * 67e12 * 0.1, peak=FP32_PEAK))))
    assert low["GPU busy"].startswith("not measured") and "MFU" in low["GPU busy"]


@pytest.mark.parametrize("busy, expected", [(65.0, 0.35), (85.0, None)])
def test_launch_bound_steps_read_above_half_busy_still_count(busy, expected):
    """NVML counts a period as busy when any kernel ran in it: a loop of tiny kernels can read
    65 % busy. Nothing measured explains the 35 % idle: it is the launches, at warning level
    and ranked first (a 50 % threshold made no finding). At 85 % busy: no finding."""
    bf16 = (H100, {**FP32_MODEL, "autocast": "bfloat16"})
    found = diagnose(cuda_run(util_during=busy, obs=bf16))
    idle = [f for f in found if f["id"] == "low_gpu_utilization"]
    if expected is None:
        assert not idle
    else:
        assert found[0]["id"] == "low_gpu_utilization" and found[0]["severity"] == "warning"
        assert found[0]["impact"] == pytest.approx(expected, abs=0.02)
