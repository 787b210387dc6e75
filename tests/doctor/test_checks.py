"""The Finding rules on synthetic run directories: each fires above its threshold, stays quiet
below it, and the CUDA-only rules work from recorded observations (no GPU needed)."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainspeed.doctor.checks import CHECKS, CheckContext, diagnose, run_checks
from trainspeed.doctor.checks import data, hardware, loop, optimizer_kernels, syncs
from trainspeed.telemetry.rundir import RunData
from trainspeed.telemetry.schema import PHASES, make_event
from trainspeed.telemetry.summary import summarize

pytestmark = pytest.mark.timeout(60)


def make_run(n=40, *, shares=None, step=0.010, pad=None, device="cpu", obs=(), events=(), grow=0.0,
             syncs_per_step=0):
    shares = shares or {"forward": 0.4, "backward": 0.5}
    steps = []
    for i in range(1, n + 1):
        t = step * (1 + grow * i / n)
        phases = {p: t * shares.get(p, 0.0) for p in PHASES}
        phases["other"] = max(0.0, t - sum(phases.values()))
        if grow:
            phases["other"] += step * grow * i / n
            phases["forward"] = step * shares.get("forward", 0)
        steps.append({"schema": 1, "step": i, "t_step": t, "phases": phases, "samples": 8, "tokens": 100,
                      "pad_share": pad, "syncs": syncs_per_step, "warmup": i <= 2, "mem": {"rss": 1e8}})
    evs = [make_event("run_start", 0, 0.0, device=device, precision="fp32")]
    evs += [make_event("observation", 0, 0.0, **o) for o in obs]
    evs += list(events)
    return RunData(path=Path("."), steps=steps, events=evs)


def ctx_of(run):
    return CheckContext.from_run(run, summarize(run))


LOADER0 = {"kind": "dataloader", "role": "train", "num_workers": 0, "pin_memory": False,
           "persistent_workers": False, "batch_size": 32, "cores": 8, "iters": 1, "iter_seconds": 0.0}


def test_data_bound_threshold_and_recommendation():
    assert data.data_bound(ctx_of(make_run(shares={"data": 0.08, "forward": 0.5}, obs=[LOADER0]))) is None
    f = data.data_bound(ctx_of(make_run(shares={"data": 0.5, "forward": 0.4}, obs=[LOADER0])))
    assert f.severity == "critical" and f.impact == pytest.approx(0.5, abs=0.01)
    assert "num_workers=7" in f.recommendation and "data.num_workers=7" in f.recommendation
    f = data.data_bound(ctx_of(make_run(shares={"data": 0.15, "forward": 0.4},
                                        obs=[{**LOADER0, "num_workers": 7}])))
    assert f.severity == "warning" and "cheaper" in f.recommendation


def test_a_data_wait_on_a_cpu_whose_cores_the_step_fills_is_at_stake_only_up_to_what_they_can_do():
    """dcgan on 2 cores, torch's 2 threads: 'data-bound, ~26 % at stake, pass --workers 1'; its
    194.8 ms of CPU a 107 ms step need 97 ms on 2 cores, so at most ~9 % comes back, and the tune
    measured --workers 1 at 0.89-1.01x. The demo's decode-bound script (1.05 of 2 cores) keeps
    most of its wait."""
    loader = {**LOADER0, "cores": 2}

    def run(data_share, cpu_cores):
        r = make_run(shares={"data": data_share, "forward": 0.3, "backward": 0.4}, step=0.1, obs=[loader])
        for s in r.steps:
            s["cpu"] = cpu_cores * s["t_step"]
        r.events.append(make_event("run_start", 0, 0.0, device="cpu", precision="fp32", cores=2))
        return r

    busy = data.data_bound(ctx_of(run(0.26, 1.82)))
    assert busy.impact == pytest.approx(0.09, abs=0.005) and busy.impact_estimated and busy.severity == "info"
    assert busy.basis.startswith("the wait, up to what 2 cores can do: the step's 182.0 ms of CPU time runs in no "
                                 "less than 91.0 ms")
    assert "about 9% of the step can come back" in busy.recommendation
    free = data.data_bound(ctx_of(run(0.84, 1.05)))
    assert free.impact == pytest.approx(0.475, abs=0.005) and free.severity == "critical"
    idle = data.data_bound(ctx_of(run(0.3, 0.5)))  # cores to spare: the wait, measured
    assert idle.impact == pytest.approx(0.3, abs=0.01) and not idle.impact_estimated


def test_a_batch_built_in_the_process_gets_a_worker_only_when_it_costs_more_than_the_hand_over():
    # pytorch/examples' regression: 0.1 ms of a 0.4 ms step builds the batch; the advice was a
    # DataLoader worker (whose hand-over costs ~1 ms a batch) and `trainspeed tune --knobs
    # num_workers`, which skips a script without a DataLoader
    small = data.data_bound(ctx_of(make_run(shares={"data": 0.25, "forward": 0.4}, step=0.0004)))
    assert "no DataLoader" in small.evidence and "num_workers=" not in small.recommendation
    assert small.recommendation.startswith("make building a batch cheaper (contiguous slices")
    assert "a DataLoader worker would cost more than it saves" in small.recommendation
    assert small.verify_with.startswith("trainspeed doctor -- ") and "tune" not in small.verify_with
    large = data.data_bound(ctx_of(make_run(shares={"data": 0.25, "forward": 0.4}, step=0.02)))
    assert "DataLoader(..., num_workers=" in large.recommendation
    assert large.verify_with.endswith("(after the change: the data share should drop)")
    # with a DataLoader, the tune sets its workers: its command verifies
    loader = data.data_bound(ctx_of(make_run(shares={"data": 0.25, "forward": 0.4}, step=0.0004, obs=[LOADER0])))
    assert loader.verify_with.endswith("--knobs num_workers")


def test_a_small_wait_without_workers_draws_no_worker_advice():
    # Lightning's CLI demo (BoringDataModule): 0.1 ms a batch, 6 % of a 1.8 ms step, was told
    # "DataLoader(..., num_workers=1)"; one worker costs about 1 ms a batch to hand over
    small = ctx_of(make_run(shares={"data": 0.06, "forward": 0.4}, step=0.0018, obs=[LOADER0]))
    assert data.dataloader_workers(small) is None
    large = data.dataloader_workers(ctx_of(make_run(shares={"data": 0.06, "forward": 0.4}, step=0.05, obs=[LOADER0])))
    assert large is not None and "num_workers=7" in large.recommendation


def test_padding_already_per_batch_is_told_to_group_lengths():
    """Batches whose padded length changes from step to step are padded to their own longest
    sequence already (HelloDeepSpeed's collate): the advice is grouping, not dynamic padding."""
    fixed = data.padding_waste(ctx_of(make_run(pad=0.6)))
    assert "pad each batch to its longest sequence" in fixed.recommendation
    assert "already padded" not in fixed.evidence
    run = make_run(pad=0.6)
    for i, rec in enumerate(run.steps):  # 8 samples of 12.5 real tokens padded to 25, 31.2 or 41.7
        rec["pad_share"] = (0.5, 0.6, 0.7)[i % 3]
    f = data.padding_waste(ctx_of(run))
    assert "already padded to their own longest sequence (3 padded lengths, 25-42 positions" in f.evidence
    assert f.recommendation.startswith("group sequences of similar length into batches")
    assert "pad_sequence" not in f.recommendation and "data.bucketing=true" in f.recommendation


def test_padding_impact_scales_with_compute_share():
    assert data.padding_waste(ctx_of(make_run(pad=0.1))) is None
    f = data.padding_waste(ctx_of(make_run(pad=0.6, shares={"forward": 0.25, "backward": 0.25})))
    assert f.severity == "critical" and f.impact == pytest.approx(0.3, abs=0.01)


def test_the_hand_over_is_compared_with_one_batchs_wait_not_the_steps():
    # transformers' run_clm_no_trainer.py (Accelerate, --gradient_accumulation_steps 4): 1.3 ms
    # of data a step over 4 batches of 0.3 ms was told "DataLoader(..., num_workers=1)"
    accumulating = [LOADER0, {"kind": "accumulation", "factor": 4}]
    small = ctx_of(make_run(shares={"data": 0.053, "forward": 0.4}, step=0.0245, obs=accumulating))
    assert data.wait_below_handover(small) == pytest.approx(0.0245 * 0.053 / 4)
    assert data.dataloader_workers(small) is None
    # the same step without accumulation waits 1.3 ms for one batch: a worker can win that
    single = ctx_of(make_run(shares={"data": 0.053, "forward": 0.4}, step=0.0245, obs=[LOADER0]))
    assert data.wait_below_handover(single) is None and data.dataloader_workers(single) is not None


def test_dataloader_settings_checks():
    assert data.pin_memory_without_cuda(ctx_of(make_run(obs=[{**LOADER0, "pin_memory": True}]))).severity == "info"
    restarts = {**LOADER0, "num_workers": 4, "iters": 5, "iter_seconds": 0.1}
    f = data.persistent_workers(ctx_of(make_run(obs=[restarts])))
    assert f.severity == "warning" and f.impact == pytest.approx(0.1 / 0.4, rel=0.05)
    assert data.persistent_workers(ctx_of(make_run(obs=[{**restarts, "persistent_workers": True}]))) is None


def test_growth_needs_the_trend_and_a_large_ratio():
    flat = make_run(n=200)
    assert loop.step_time_growth(ctx_of(flat)) is None
    grown = make_run(n=200, grow=1.5, obs=[{"kind": "files", "grown": [{"path": "log.txt", "grew": 4096}]}])
    ctx = ctx_of(grown)
    assert ctx.summary["trend"] is not None
    f = loop.step_time_growth(ctx)
    assert f.severity in ("warning", "critical") and '"other"' in f.evidence and "log.txt" in f.evidence
    ctx.summary["trend"] = None  # the noise test said no: do not cry wolf
    assert loop.step_time_growth(ctx) is None


def test_checkpoint_interval_recommendation():
    saves = [make_event("checkpoint", i, 0.0, seconds=0.002, bytes=2**20) for i in range(40)]
    f = loop.checkpointing(ctx_of(make_run(shares={"ckpt": 0.2, "forward": 0.5}, events=saves)))
    assert f.title == "Checkpointing too often"
    # 2 ms per save, 10 ms per step, keep <= 2 %: every >= 10 steps
    assert "checkpoint.every_steps=10 " in f.recommendation
    rare = [make_event("checkpoint", 20, 0.0, seconds=0.002)]
    assert loop.checkpointing(ctx_of(make_run(shares={"ckpt": 0.004, "forward": 0.5}, events=rare))) is None


def test_engine_saves_are_timed_by_what_blocked_training():
    """The engine's checkpoint events carry blocking_s (no "seconds"); a DeepSpeed save (.ds)
    writes before it returns, so there is no background write to recommend."""
    saves = [make_event("checkpoint", i, 0.0, kind="save", blocking_s=0.002, write_s=0.002,
                        path=f"ckpts/step-{i:08d}.ds") for i in range(40)]
    f = loop.checkpointing(ctx_of(make_run(shares={"ckpt": 0.2, "forward": 0.5}, events=saves)))
    assert "2.0 ms each" in f.evidence
    assert f.recommendation.endswith("(engine: checkpoint.every_steps=10)")


def _sites(category, kind, count, seconds=0.0, site="train.py:9"):
    return {"kind": "call_sites", "rows": [{"category": category, "kind": kind, "site": site, "code": "x",
                                            "count": count, "seconds": seconds}],
            "totals": {category: {kind: {"count": count, "seconds": seconds}}}}


def test_host_syncs_per_step_and_severity_by_device():
    assert syncs.host_syncs(ctx_of(make_run(obs=[_sites("sync", "item", 10)]))) is None  # 0.25/step
    f = syncs.host_syncs(ctx_of(make_run(obs=[_sites("sync", "item", 40, 0.001)])))
    # on a CPU a read costs nothing: info, with its expected cost on a GPU
    assert f.severity == "info" and "on a GPU each one makes the host wait" in f.evidence and not f.impact_estimated
    cuda = make_run(device="cuda", obs=[_sites("sync", "item", 800), {"kind": "device", "type": "cuda"}])
    f = syncs.host_syncs(ctx_of(cuda))
    # no wait inside the reads and no GPU busy figure: nothing measured, nothing at stake (no constant)
    assert f.severity == "critical" and f.impact == 0.0 and "wait inside the reads" in f.basis
    # cache/GC calls are not host-sync findings, they have their own
    gc_run = make_run(obs=[_sites("sync", "gc_collect", 40, 0.2)])
    assert syncs.host_syncs(ctx_of(gc_run)) is None
    assert syncs.cache_gc_in_loop(ctx_of(gc_run)).impact == pytest.approx(0.5, rel=0.05)


def test_a_run_that_ended_in_the_warm_up_gives_its_header_rate_and_no_every_step_from_one_step():
    """time_sequence_prediction --steps 2 (LBFGS, both steps warm-up): the header read 'host syncs
    21 per step' (its step records: 20 and 22) and the finding '22 host syncs per step ... 44 in
    all' (the call sites' 44 over 2 steps, 2 of them read after the last step). Both say 21 now.
    Lightning's bug_report_model ran one step: 'reads device values every step' claimed a
    recurrence no second step showed."""
    run = make_run(n=2, obs=[_sites("sync", "item", 44, 0.001)])
    for record, syncs_in_step in zip(run.steps, (20, 22)):
        record["syncs"], record["warmup"] = syncs_in_step, True
    ctx = ctx_of(run)
    f = syncs.host_syncs(ctx)
    assert ctx.summary["syncs_per_step"] == 21 and f.evidence.startswith("21 host syncs per step, every step (")
    assert "(all steps, warm-up included, plus 2 one-off reads outside the steps; 44 in all," in f.evidence
    one = make_run(n=1, obs=[_sites("sync", "item", 8, 0.001)])
    one.steps[0]["syncs"], one.steps[0]["warmup"] = 8, True
    f = syncs.host_syncs(ctx_of(one))
    assert f.title == "The loop reads device values in its one recorded step (host syncs)"
    assert f.evidence.startswith("8 host syncs in its one recorded step (") and "every step" not in f.evidence
    # bug_report_model: its one step's record counted none; the 8 reads came after it (end of fit, test)
    one.steps[0]["syncs"] = 0
    assert syncs.host_syncs(ctx_of(one)) is None


def test_one_empty_cache_in_a_run_of_two_steps_is_not_a_call_in_the_loop():
    """memory_limit.py calls empty_cache once, before its loop; on an H100 it died of an OOM after
    two steps, and '1 call / 2 steps' read as 'empty_cache runs inside the training loop' (a
    warning, ranked first). A call in the loop repeats: at least CACHE_GC_MIN_CALLS of them."""
    once = make_run(n=2, obs=[_sites("sync", "empty_cache", 1, 0.001)])
    assert syncs.cache_gc_in_loop(ctx_of(once)) is None
    three = make_run(n=6, obs=[_sites("sync", "empty_cache", syncs.CACHE_GC_MIN_CALLS, 0.001)])
    assert syncs.cache_gc_in_loop(ctx_of(three)).severity == "warning"


CUDA_DEVICE = {"kind": "device", "type": "cuda", "name": "NVIDIA A100", "capability": "8.0",
               "total_memory": 40 * 2**30, "bf16_supported": True, "tf32_matmul": False,
               "float32_matmul_precision": "highest"}
FP32_MODEL = {"kind": "model", "class": "Net", "param_dtype": "float32", "compiled": False,
              "data_parallel": False, "autocast": None, "device": "cuda"}


def test_fp32_on_tensor_cores_from_observations():
    f = hardware.fp32_on_tensor_cores(ctx_of(make_run(device="cuda", obs=[CUDA_DEVICE, FP32_MODEL])))
    assert f.severity == "warning" and "precision.mode=bf16-mixed" in f.recommendation and "TF32" in f.evidence
    amp = {**FP32_MODEL, "autocast": "bfloat16"}
    assert hardware.fp32_on_tensor_cores(ctx_of(make_run(device="cuda", obs=[CUDA_DEVICE, amp]))) is None
    old = {**CUDA_DEVICE, "capability": "6.1"}
    assert hardware.fp32_on_tensor_cores(ctx_of(make_run(device="cuda", obs=[old, FP32_MODEL]))) is None


def test_optimizer_memory_and_accumulation_rules():
    opt = {"kind": "optimizer", "class": "AdamW", "fused": None, "foreach": False, "params": 10, "primary": True}
    run = make_run(device="cuda", shares={"optimizer": 0.2, "forward": 0.5}, obs=[CUDA_DEVICE, opt])
    f = optimizer_kernels.optimizer_not_fused(ctx_of(run))
    assert f.severity == "warning" and "fused=True" in f.recommendation
    # on the CPU torch's default is the per-parameter loop (foreach by default for CUDA only):
    # fused AdamW ran healthy.py 1.51x faster; foreach is never advised there (0.92x)
    default = {**opt, "foreach": None, "implementations": ["fused", "foreach"]}
    cpu = optimizer_kernels.optimizer_not_fused(ctx_of(make_run(shares={"optimizer": 0.46, "forward": 0.3}, obs=[default])))
    assert cpu.recommendation.startswith("AdamW(..., fused=True)") and "on the CPU (foreach is the default" in cpu.evidence
    assert cpu.impact == pytest.approx(optimizer_kernels.CPU_FUSED_REMOVES * 0.46) and cpu.severity == "info"
    assert optimizer_kernels.optimizer_not_fused(ctx_of(make_run(shares={"optimizer": 0.02}, obs=[default]))) is None
    assert optimizer_kernels.optimizer_not_fused(ctx_of(make_run(shares={"optimizer": 0.4}, obs=[{**default, "fused": True}]))) is None
    # a class without a fused kernel: foreach on CUDA for a forced loop, nothing on the CPU, never fused=True
    # (RMSprop(fused=True) is a TypeError)
    rms = {**opt, "class": "RMSprop", "implementations": ["foreach"]}
    f = optimizer_kernels.optimizer_not_fused(ctx_of(make_run(device="cuda", shares={"optimizer": 0.2}, obs=[CUDA_DEVICE, rms])))
    assert f.recommendation.startswith("RMSprop(..., foreach=True)")
    assert optimizer_kernels.optimizer_not_fused(ctx_of(make_run(shares={"optimizer": 0.4}, obs=[rms]))) is None
    on_default = {**rms, "foreach": None}
    assert optimizer_kernels.optimizer_not_fused(ctx_of(make_run(device="cuda", shares={"optimizer": 0.4},
                                                        obs=[CUDA_DEVICE, on_default]))) is None  # foreach already
    # one backward, two optimizers over one model (SGD for the matrices, AdamW for the rest, as
    # modded-nanogpt splits Muon and Adam): both are named, each with what it takes; one fused
    # already, or one that takes nothing faster, is left out
    sgd = {**default, "class": "SGD", "name": "opt_matrices", "updates": ["Net"], "params": 131072}
    adamw = {**default, "primary": False, "updates": ["Net"], "params": 26340}
    both = optimizer_kernels.optimizer_not_fused(ctx_of(make_run(shares={"optimizer": 0.3}, obs=[sgd, adamw])))
    assert both.title == "2 optimizers (opt_matrices (SGD over Net), AdamW over Net) run a per-parameter loop"
    assert both.recommendation == "SGD(..., fused=True), AdamW(..., fused=True) (engine: optim.implementation=fused)"
    assert "SGD(fused=None, foreach=None) over 131072 parameters; AdamW(fused=None" in both.evidence
    one = optimizer_kernels.optimizer_not_fused(ctx_of(make_run(shares={"optimizer": 0.3},
                                                                obs=[sgd, {**adamw, "fused": True}, {**rms, "primary": False}])))
    assert one.title == "opt_matrices (SGD over Net) runs a per-parameter loop"
    ctx = ctx_of(make_run(device="cuda", obs=[CUDA_DEVICE, {"kind": "accumulation", "factor": 8}]))
    ctx.summary["memory"] = {"cuda_alloc_peak": 39.5 * 2**30, "cuda_reserved_peak": 39.8 * 2**30}
    assert hardware.memory_pressure(ctx).id == "memory_near_oom"
    assert hardware.accumulation_for_speed(ctx) is None  # accumulation is plausibly for memory
    ctx.summary["memory"] = {"cuda_alloc_peak": 4 * 2**30, "cuda_reserved_peak": 5 * 2**30}
    assert hardware.memory_pressure(ctx).id == "memory_headroom"
    assert hardware.accumulation_for_speed(ctx).severity == "info"


def test_a_quiet_run_has_no_warning_and_a_broken_check_is_contained():
    findings = diagnose(make_run(obs=[LOADER0, {**FP32_MODEL, "device": "cpu"}]))
    assert [f["severity"] for f in findings if f["severity"] != "info"] == []

    def broken(ctx):
        raise KeyError("boom")

    out = run_checks(ctx_of(make_run()), (broken,))
    assert out[0].id == "check_error.broken" and out[0].severity == "info"
    assert len(CHECKS) >= 15


def compute_run(mfu, device="cpu", bf16_fast=False, compiled=False):
    # 10 ms steps; FLOPs per step chosen so that FLOPs / step time / peak = mfu
    peak = 1e12
    run = make_run(device=device, obs=[{"kind": "model", "class": "GPT", "compiled": compiled}], events=[
        make_event("peak_flops", 0, 0.0, name="dev", dtype="fp32", flops=peak, source="measured"),
        make_event("flops", 0, 0.0, flops_per_step=mfu * peak * 0.010)])
    run.env = {"cpu": {"bf16_fast": bf16_fast}}
    return run


def test_compute_bound_says_overhead_fixes_have_little_to_win_and_what_still_can():
    f = hardware.compute_bound(ctx_of(compute_run(0.62)))
    assert f.id == "compute_bound" and f.severity == "info" and "62%" in f.title
    assert "MFU 62% of dev fp32 (measured)" in f.evidence and "90% of the step" in f.evidence
    # A CPU without bf16 units: compile and a faster device, and why not bf16.
    assert "compile.mode=default" in f.recommendation and "no bf16 units" in f.recommendation
    assert "precision.mode=bf16-mixed" not in f.recommendation
    assert f.verify_with.endswith("--knobs compile")
    # A GPU in fp32 is told about bf16; a compiled model is not told to compile.
    gpu = hardware.compute_bound(ctx_of(compute_run(0.55, device="cuda", compiled=True)))
    assert "precision.mode=bf16-mixed" in gpu.recommendation and "compile.mode" not in gpu.recommendation
    assert "--knobs precision,compile" in gpu.verify_with
    # Below half the peak, or an impossible MFU (a wrong FLOP count), it stays quiet.
    assert hardware.compute_bound(ctx_of(compute_run(0.3))) is None
    assert hardware.compute_bound(ctx_of(compute_run(1.5))) is None
    assert hardware.compute_bound in CHECKS


def test_low_gpu_utilization_reads_the_samplers_own_series_keys():
    """The finding reads the `system` event's series the Monitor writes from
    SystemSampler.series(), so the key names must agree (a fake NVML reader stands in for the
    GPU); only the rows inside the measured steps count."""
    import time

    from trainspeed.telemetry.sampler import SystemSampler

    class IdleGpu:
        def read(self):
            return {"gpu_util": 30.0, "gpu_mem_used": 1.0, "gpu_power_w": 80.0, "gpu_sm_clock_mhz": 1400.0}

        def close(self):
            pass

    def run_with(gpu):
        s = SystemSampler(gpu_reader=gpu)
        for _ in range(4):
            s.sample_once()
        event = make_event("system", 40, 0.0, **s.summary(), series=s.series())
        s.stop()
        run = make_run(device="cuda", events=[event])
        end = time.time() + 0.001
        for i, rec in enumerate(run.steps):  # the steps span the rows just taken
            rec["t_wall"] = end - (len(run.steps) - 1 - i) * rec["t_step"]
        return run

    busy = type("BusyGpu", (IdleGpu,), {"read": lambda self: {**IdleGpu.read(self), "gpu_util": 97.0}})
    f = hardware.low_gpu_utilization(ctx_of(run_with(IdleGpu())))
    assert f is not None and f.severity == "warning" and "GPU busy 30%" in f.evidence
    assert f.impact == pytest.approx(0.7)
    assert hardware.low_gpu_utilization(ctx_of(run_with(busy()))) is None


def test_sync_fix_points_at_the_library_when_the_read_is_not_in_user_code(tmp_path):
    lib = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "somelib"
    lib.mkdir(parents=True)
    (lib / "loop.py").write_text("x = 1\nif loss.isnan():\n    pass\n")
    row = {"category": "sync", "kind": "bool", "site": f"{lib / 'loop.py'}:2", "code": "if loss.isnan():", "count": 80}
    assert syncs.library_of(row["site"]) == "somelib"
    assert syncs.library_of("train.py:12") is None
    text = syncs._fix(row)
    assert "inside somelib" in text and "option" in text
    assert syncs._fix({**row, "site": "train.py:12"}).startswith("For ")


def test_ranks_the_script_started_itself_are_named_with_the_torchrun_command():
    # Lightning's DDP (devices=2, strategy="ddp") under `trainspeed doctor -- python train.py
    # --devices 2`: Lightning started rank 1 as a new process, outside the doctor; the report
    # was rank 0's with nothing saying so
    from trainspeed.doctor.checks.distributed import unmeasured_ranks

    group = {"kind": "process_group", "world_size": 2, "rank": 0, "backend": "gloo"}
    run = make_run(obs=[group, {"kind": "framework", "name": "lightning"}])
    run.config = {"command": ["python", "train.py", "--devices", "2"]}
    f = unmeasured_ranks(ctx_of(run))
    assert f.id == "unmeasured_ranks" and f.title == "Only rank 0 of the 2 ranks was measured"
    assert "started by lightning as new processes" in f.evidence and f.impact == 0.0
    assert f.verify_with == "trainspeed doctor -- torchrun --nproc_per_node 2 train.py --devices 2"
    assert "it ended" not in f.evidence
    ended = make_run(obs=[group, {"kind": "doctor", "stopped": "steps", "ended_ranks": 1}])
    ended.config = run.config
    assert "; it ended 1 of them when it stopped this rank" in unmeasured_ranks(ctx_of(ended)).evidence
    one = make_run(obs=[dict(group, world_size=1)])
    one.config = run.config
    assert unmeasured_ranks(ctx_of(one)) is None
    every = ctx_of(run)
    every.summary["ranks"] = [{"rank": 0}, {"rank": 1}]  # the doctor ran in both (torchrun)
    assert unmeasured_ranks(every) is None


def test_an_optimizer_is_named_by_the_variable_it_is_assigned_to_never_by_a_containers(tmp_path):
    from trainspeed.doctor.instrument.updates import assigned_name

    script = tmp_path / "train.py"
    script.write_text("optimizerD = optim.Adam(netD.parameters())\n"
                      "opt: torch.optim.Optimizer = SGD(params)\n"
                      "optimizers = [torch.optim.SGD(matrices), torch.optim.AdamW(others)]\n"
                      "optimizers = (\n"
                      "self.opt = AdamW(p)\n")
    names = [assigned_name((str(script), line)) for line in range(1, 6)]
    assert names == ["optimizerD", "opt", None, None, "self.opt"]
