"""Input-pipeline findings: data-bound steps, padding waste, DataLoader settings vs cores."""

from __future__ import annotations

import numpy as np

from trainspeed.doctor.checks.context import CheckContext, ms, pct
from trainspeed.doctor.checks.script_flags import flag_note, script_flag, script_padding_flag, set_flag, show_flag
from trainspeed.doctor.findings import Finding

DATA_WAIT_WARNING = 0.10
"""Data wait above 10 % of step time: the input pipeline, not the model, sets the pace
(PyTorch Performance Tuning Guide, "enable async data loading": workers should hide loading
behind compute; NVIDIA DALI docs call a GPU that waits on the loader "data-bound")."""
DATA_WAIT_CRITICAL = 0.30
"""Above 30 % the loader dominates: fixing it is worth more than any model-side switch."""
DATA_WAIT_NOTICE = 0.05
"""Below the warning, a visible wait with num_workers=0 still earns an info note."""
PAD_WARNING = 0.20
"""A fifth of the token positions being padding wastes a fifth of the matmul work (Hugging Face
docs, "dynamic padding"; NVIDIA's BERT recipes bucket sequences by length for this reason)."""
PAD_CRITICAL = 0.50
"""Half the compute on padding: dynamic padding alone roughly halves the step."""
WORKER_RESTART_WARNING = 0.05
"""Re-forking DataLoader workers each epoch (persistent_workers=False) costing more than 5 % of
the run is worth a warning (PyTorch docs: persistent_workers keeps workers alive across epochs)."""
H2D_WARNING = 0.10
"""Host-to-device copies above 10 % of step time on CUDA: pinned memory + non_blocking copies
let them overlap with compute (PyTorch "pin_memory" tuning guide)."""
MAX_SUGGESTED_WORKERS = 8
"""More workers than this rarely help and cost memory (one dataset copy each)."""


WORKER_HANDOVER_S = 1e-3
"""What handing one batch from a DataLoader worker to the training process costs it, at least:
on the 2-core EPYC VM a worker that was ahead still took 1.1 ms per batch of two small tensors
(2 ms beside a busy step) where building it in the process took 0.08 ms. A batch built in the
training process in less than this is not worth a worker (pytorch/examples' regression: 0.1 ms
of a 0.4 ms step was "data", and the advice was a DataLoader with a worker)."""


def wait_below_handover(ctx: CheckContext) -> float | None:
    """The wait for one batch when it is shorter than a worker's hand-over (so no worker would
    help), else None. A step that accumulates over k micro-batches waits for k batches: an
    Accelerate loop's 1.3 ms a step at 4 micro-batches of 0.3 ms was told to add a worker."""
    wait = ctx.phase_mean("data")
    if wait is None:
        return None
    factor = (ctx.first("accumulation") or {}).get("factor")
    per_batch = wait / factor if isinstance(factor, (int, float)) and factor > 1 else wait
    return per_batch if per_batch < WORKER_HANDOVER_S else None


def suggested_workers(cores: int) -> int:
    """Leave one core for the training process; at least 1, at most MAX_SUGGESTED_WORKERS."""
    return max(1, min(MAX_SUGGESTED_WORKERS, cores - 1))


def _loader_text(loader: dict) -> str:
    return (f"DataLoader(batch_size={loader.get('batch_size')}, num_workers={loader.get('num_workers')}, "
            f"pin_memory={loader.get('pin_memory')}, persistent_workers={loader.get('persistent_workers')}) "
            f"on {loader.get('cores')} usable cores")


WORKER_CPU_MIN = 0.25
"""With workers, a wait for the next batch is the loader's work when the workers spent at least
a quarter of it on the CPU per step; on a machine whose cores others hold, a wait the workers did
not work through is the hand-over waiting for cores (karpathy/makemore: 12 ms of a 110 ms step
waited, its 4 workers used ~0 ms of CPU per step, the batch built in the training process took
1 ms; one busy-machine reading of the script's flag A/B had 0 workers 1.7x slower)."""


def data_bound(ctx: CheckContext) -> Finding | None:
    share = ctx.share("data")
    if share < DATA_WAIT_WARNING:
        return None
    loader = ctx.train_loader()
    if loader and int(loader.get("num_workers") or 0) > 0:
        idle = _idle_workers_on_busy_machine(ctx)
        if idle is not None:
            return idle
    cores = ctx.cores
    workers_flag = script_flag(ctx, "num_workers")
    if loader:
        evidence = (f"waiting for the next batch takes {pct(share)} of step time "
                    f"({ms(ctx.phase_mean('data'))} of {ms(ctx.step_mean)} per step); {_loader_text(loader)}")
        evidence += flag_note(ctx, "num_workers")
    else:
        evidence = (f"building the next batch in the training process (no DataLoader) takes {pct(share)} of "
                    f"step time ({ms(ctx.phase_mean('data'))} of {ms(ctx.step_mean)} per step)")
    workers = int(loader.get("num_workers") or 0) if loader else 0
    verify = ctx.tune_command("num_workers")
    advised: int | None = None  # the worker count the advice names, which a tune may have measured
    per_sample = ("make per-sample work cheaper (decode/preprocess once and cache tensors, avoid Python loops "
                  "in __getitem__, batch the transform in collate_fn)")
    cheaper = ("contiguous slices read at once instead of a Python loop over rows; data prepared once and "
               "cached")
    if not loader:
        n = suggested_workers(cores)
        # the tune's num_workers knob needs a DataLoader to set: it skips such a script
        verify = f"{ctx.doctor_command()} (after the change: the data share should drop)"
        if (wait := wait_below_handover(ctx)) is not None:
            recommendation = (f"make building a batch cheaper ({cheaper}): at {ms(wait)} a batch, a DataLoader "
                              f"worker would cost more than it saves (handing a batch over from a worker process "
                              f"takes about {ms(WORKER_HANDOVER_S)})")
        else:
            recommendation = ("the batches are built between the steps, in the training process: build them "
                              f"ahead in a Dataset + DataLoader(..., num_workers={n}, persistent_workers=True) "
                              f"so the work overlaps with the step, or make building one cheaper ({cheaper})")
    elif workers == 0 and cores > 1 and (wait := wait_below_handover(ctx)) is not None:
        # a Hydra app's TensorDataset batch: 0.3 ms waited; its tune measured 1 worker at 0.35x
        recommendation = (f"make building a batch cheaper ({cheaper}; batch the work in collate_fn): at "
                          f"{ms(wait)} a batch, a worker would likely cost more than it saves (handing a batch "
                          f"over from a worker process takes about {ms(WORKER_HANDOVER_S)}); the tune below "
                          "measures workers on this machine")
    elif workers == 0 and cores > 1:
        n = advised = suggested_workers(cores)
        how = (f"pass {set_flag(workers_flag, n)} (now {show_flag(workers_flag)}), the script's "
               f"DataLoader(num_workers=...)" if workers_flag else
               f"DataLoader(..., num_workers={n}, persistent_workers=True"
               f"{', pin_memory=True' if ctx.device_type == 'cuda' else ''})")
        recommendation = (f"load batches in background workers: {how} "
                          f"(engine: data.num_workers={n}); the per-sample work then overlaps with the step")
    elif workers == 0:
        recommendation = ("with a single usable core, background workers would take it from the training "
                          f"process: {per_sample}, or run on a machine with more cores")
    elif workers < suggested_workers(cores):
        n = advised = suggested_workers(cores)
        how = f" ({set_flag(workers_flag, n)})" if workers_flag else ""
        recommendation = (f"raise num_workers from {loader.get('num_workers')} to {n}{how} "
                          f"(engine: data.num_workers={n}) and/or prefetch_factor")
    elif workers >= cores > 0:
        # minGPT's 4 workers on 2 cores: the workers and the training process share too few cores
        from trainspeed.doctor.checks.machine import workers_cpu_per_step

        n = advised = suggested_workers(cores)
        fewer = f"{set_flag(workers_flag, n)}, now {show_flag(workers_flag)}" if workers_flag else f"num_workers={n}"
        zero = set_flag(workers_flag, 0) if workers_flag else "num_workers=0"
        work = workers_cpu_per_step(ctx)
        none = ("" if work is not None and work >= WORKER_HANDOVER_S else
                f", or none ({zero}) when building a batch costs less than handing it over from a worker "
                f"(about {ms(WORKER_HANDOVER_S)} a batch{f'; the workers used {ms(work)} a step' if work else ''})")
        recommendation = (f"{workers} workers and the training process share {cores} cores: use fewer ({fewer}; "
                          f"engine: data.num_workers={n}){none}; and make per-sample work cheaper where you can")
    else:
        recommendation = ("the loader cannot keep up even with workers: make per-sample work cheaper "
                          "(decode/preprocess once and cache tensors, move augmentation to the GPU, "
                          "avoid Python loops in __getitem__), or batch the transform in collate_fn")
    impact, basis = share, "the wait for the next batch, measured"
    bound = cpu_bound_share(ctx, workers)
    if bound is not None and bound < share - 0.005:
        impact = bound
        # an estimate, not a bound: workers may spend less CPU than the process did (the demo's
        # 47 % read 2.04x in its compare, 51 % of the step won)
        cpu, shortest = ms(ctx.summary.get("cpu_per_step")), ms(ctx.step_mean * (1 - bound))
        basis = (f"the wait, up to what {cores} cores can do: the step's {cpu} of CPU time runs in no less than "
                 f"{shortest} on them, spent as now")
        back = f"about {pct(impact)} of the step can come back" if impact >= 0.005 else "next to nothing can come back"
        recommendation += (f". The step's CPU work ({cpu}, building the batch included) takes at least {shortest} "
                           f"on {cores} cores however many workers share it: {back}; the tune measures it")
    severity = "critical" if impact >= DATA_WAIT_CRITICAL else "warning" if impact >= DATA_WAIT_WARNING else "info"
    # an info is not "data-bound": a newcomer's MLP waited 15 % of its step, ~0 % recoverable
    waits = "the step waits for the DataLoader" if loader else "the step waits while the script builds its batch"
    return Finding(
        id="data_bound",
        severity=severity,
        title=f"Training is data-bound: {waits}" if severity != "info" else f"{waits[0].upper()}{waits[1:]} ({pct(share)} of step time)",
        evidence=evidence,
        recommendation=recommendation,
        verify_with=verify,
        impact=impact,
        impact_estimated=impact != share,
        basis=basis,
        # a tune that measured this worker count as no gain replaces the advice (doctor/tuned.py):
        # the demo's after-run advised num_workers=1 beside a tune's 1 at 1.00x and 2 at 1.64x
        advises={"num_workers": str(advised)} if advised is not None else {},
        otherwise=per_sample if advised is not None else "",
    )


def cpu_bound_share(ctx: CheckContext, workers: int) -> float | None:
    """The share of a CPU step that moving its data work into workers can win, estimated: the
    step's CPU time (data work included) still has to run on the machine's cores, so the step
    takes at least max(its compute phases, CPU time / cores), if workers spend that CPU as the
    process did (they may spend less: the demo won a little more). None on a GPU, for a loader that
    already has workers, or without a CPU reading. dcgan on 2 cores, torch's 2 threads:
    'data-bound, ~26 % at stake, pass --workers 1', and the tune measured --workers 1 at
    0.89-1.01x; the demo's decode-bound script (1.05 of 2 cores used) keeps most of its wait."""
    cpu, step, wait, cores = ctx.summary.get("cpu_per_step"), ctx.step_mean, ctx.phase_mean("data"), ctx.cores
    if ctx.device_type != "cpu" or workers or cores < 1 or not isinstance(cpu, (int, float)) or not step or not wait:
        return None
    shortest = max(step - wait, float(cpu) / cores)
    return max(0.0, (step - shortest) / step)


def _idle_workers_on_busy_machine(ctx: CheckContext) -> Finding | None:
    """The step waited for its DataLoader workers while they hardly used the CPU, on a machine
    whose cores other processes held: the wait is the hand-over of batches between processes
    that each wait for a core (a worker answers the training process's request for a batch's
    shared memory), not the pipeline's work; nothing in the script to make cheaper. Said at
    info level with nothing at stake, or None when the workers did the work or the machine
    had cores free (a loader that waits on a slow disk does not use the CPU either)."""
    from trainspeed.doctor.checks.machine import busy_machine, got_text, workers_cpu_per_step

    wait = ctx.phase_mean("data")
    busy = busy_machine(ctx)
    workers = workers_cpu_per_step(ctx)
    if not wait or busy is None or workers is None or workers >= WORKER_CPU_MIN * wait:
        return None
    return Finding(
        id="data_bound",
        severity="info",
        title="The step waits for its DataLoader workers, which wait for a core (the busy machine, not the data)",
        evidence=(f"waiting for the next batch takes {pct(ctx.share('data'))} of step time ({ms(wait)} of "
                  f"{ms(ctx.step_mean)} per step) while the workers used {ms(workers)} of CPU per step; "
                  f"{_loader_text(ctx.train_loader() or {})}; other processes used {busy['others']:.1f} of the "
                  f"machine's {busy['cores']} cores{got_text(busy, ctx)}"),
        recommendation=("nothing to make cheaper in the data pipeline: its workers hardly worked, the batches "
                        "waited for a core to be handed over. Measure on a quiet machine or on cores of the run's "
                        "own (taskset -c) before changing the pipeline"),
        verify_with=ctx.tune_command("num_workers"),
        impact=0.0,
        basis="the wait for the next batch, measured, against the workers' CPU time",
    )


def padding_share(ctx: CheckContext) -> float | None:
    """The run's padding share when it is large enough for the padding finding, else None."""
    pad = ctx.summary.get("pad_share")
    return float(pad) if isinstance(pad, (int, float)) and pad >= PAD_WARNING else None


def padded_per_batch(ctx: CheckContext) -> bool:
    """Whether the batches are already padded to their own longest sample (their padded length
    changes from batch to batch)."""
    return len(padded_lengths(ctx)) > 1


def padded_lengths(ctx: CheckContext) -> list[float]:
    """The distinct padded lengths (token positions per sample: real tokens plus padding) of
    the run's measured steps, sorted; one value when every batch is padded to a fixed length."""
    tokens, pad, samples = (ctx.run.array(k) for k in ("tokens", "pad_share", "samples"))
    ok = np.isfinite(tokens) & np.isfinite(pad) & (pad < 1) & (samples > 0) & (tokens > 0)
    per_sample = tokens[ok] / (1.0 - pad[ok]) / samples[ok]
    return sorted({round(float(v), 1) for v in per_sample})


BUCKETING = ("a length-bucketed batch sampler (sort a pool of ~100 batches' samples by length, cut it into "
             "batches, shuffle the batches), or the group_by_length option of your trainer")


def padding_split(ctx: CheckContext) -> tuple[float, float] | None:
    """(share of token positions past each batch's longest sample, share of padding inside it)
    over the batches whose padding was measured: what padding per batch removes, and what is
    left for batching similar lengths together. None when the run did not record it."""
    batch = ctx.first("batch") or {}
    total, pad, beyond = (batch.get(k) for k in ("measured_tokens", "measured_pad", "beyond_longest"))
    if not all(isinstance(v, (int, float)) for v in (total, pad, beyond)) or not total:
        return None
    return beyond / total, max(0.0, pad - beyond) / total


def padding_waste(ctx: CheckContext) -> Finding | None:
    pad = padding_share(ctx)
    if pad is None:
        return None
    batch = ctx.first("batch") or {}
    compute = ctx.share("forward") + ctx.share("backward")
    impact = pad * (compute if compute > 0 else 1.0)
    source = batch.get("pad_source") or "detected pad id"
    evidence = (f"{pct(pad)} of token positions are padding (read from {source}; "
                f"batches of {batch.get('batch_size')} x {batch.get('max_seq_len') or batch.get('seq_len')} positions); "
                f"forward+backward is {pct(compute)} of step time")
    lengths = padded_lengths(ctx)
    dynamic = padded_per_batch(ctx)
    split = None if dynamic else padding_split(ctx)
    if dynamic:
        # Already padded per batch (the padded length changes from batch to batch): what is
        # left is the spread of lengths inside a batch, which only grouping removes.
        evidence += (f"; batches are already padded to their own longest sequence ({len(lengths)} padded "
                     f"lengths, {lengths[0]:.0f}-{lengths[-1]:.0f} positions per sample)")
        recommendation = f"group sequences of similar length into batches: {BUCKETING} (engine: data.bucketing=true)"
    else:
        recommendation = ("pad each batch to its longest sequence, not to a fixed max length (a collate_fn "
                          "using torch.nn.utils.rnn.pad_sequence, or DataCollatorWithPadding), and group "
                          "similar lengths into batches (engine: data.dynamic_padding=true data.bucketing=true)")
    if split is not None:
        # run_glue_no_trainer.py --pad_to_max_length: 69 % padding, of which per-batch padding removed
        # little (batches of 16 usually hold one sample near --max_length); the tune measured 1.01x
        evidence += (f"; padding each batch to its own longest sample removes {pct(split[0])} of the positions, "
                     f"batching similar lengths together the other {pct(split[1])}")
    verify_with = ctx.tune_command("padding")
    verify_impact = None
    flag = script_padding_flag(ctx, dynamic)
    if flag is not None:
        # The script holds the fix in its own flag (Hugging Face's --pad_to_max_length): told to
        # write a collate_fn, its user would have rewritten what the flag already switches.
        evidence += f"; the script's flag: {show_flag(flag[0])}"
        action = set_flag(*flag)  # "(leave out --pad_to_max_length)" for a switch turned off
        action = action[1:-1] if action.startswith("(") else f"pass {action}"
        if flag[1]:
            recommendation = f"{action} (samples of similar length batched together)"
        elif split is not None and split[1] > split[0]:
            recommendation = (f"{action} (each batch padded to its own longest sample: {pct(split[0])} of the "
                              f"positions), and batch similar lengths together for the other {pct(split[1])}: "
                              f"{BUCKETING}")
        else:
            recommendation = f"{action} (each batch padded to its own longest sample)"
        verify_with = ctx.tune_command("padding_flag")
        if not flag[1] and split is not None:  # the flag pads per batch: only the positions past the longest go
            verify_impact = min(impact, split[0] * (compute if compute > 0 else 1.0))
    return Finding(
        id="padding_waste",
        severity="critical" if pad >= PAD_CRITICAL else "warning",
        title="Much of the compute is spent on padding tokens",
        evidence=evidence,
        recommendation=recommendation,
        verify_with=verify_with,
        impact=impact,
        verify_impact=verify_impact,
        basis=f"padding share {pct(pad)} x forward+backward {pct(compute)} of the step",
    )


def dataloader_workers(ctx: CheckContext) -> Finding | None:
    """num_workers=0 on a multi-core machine with a visible (but sub-warning) data wait."""
    loader = ctx.train_loader()
    share = ctx.share("data")
    if not loader or int(loader.get("num_workers") or 0) != 0 or ctx.cores < 2:
        return None
    if share < DATA_WAIT_NOTICE or share >= DATA_WAIT_WARNING:  # data_bound covers the latter
        return None
    if wait_below_handover(ctx) is not None:
        return None  # a worker's hand-over costs more than this wait (LightningCLI's demo: 0.1 ms a batch)
    n = suggested_workers(ctx.cores)
    return Finding(
        id="dataloader_workers",
        severity="info",
        title="DataLoader loads in the training process (num_workers=0)",
        evidence=f"data wait is {pct(share)} of step time; {_loader_text(loader)}{flag_note(ctx, 'num_workers')}",
        recommendation=(f"{set_flag(flag, n)} (the script's flag)" if (flag := script_flag(ctx, "num_workers")) else
                        f"DataLoader(..., num_workers={n}, persistent_workers=True)") + f" (engine: data.num_workers={n})",
        verify_with=ctx.tune_command("num_workers"),
        impact=share,
        basis="the wait for the next batch, measured",
    )


def pin_memory_without_cuda(ctx: CheckContext) -> Finding | None:
    if ctx.device_type == "cuda":
        return None
    pinned = [lo for lo in ctx.obs("dataloader") if lo.get("pin_memory")]
    if not pinned:
        return None
    # where they are built (llama2.c: one site, a new loader per split and evaluation)
    sites = sorted({str(lo["site"]) for lo in pinned if lo.get("site")})
    where = f" ({', '.join(sites)})" if sites else ""
    return Finding(
        id="pin_memory_without_cuda",
        severity="info",
        title="pin_memory=True without a CUDA device",
        evidence=f"{len(pinned)} DataLoader(s){where} pin memory but training runs on {ctx.device_type}",
        recommendation=(f"{set_flag(flag, False)} (the script's flag, now {show_flag(flag)})"
                        if (flag := script_flag(ctx, "pin_memory")) else
                        f"set pin_memory=False{' at ' + ', '.join(sites) if sites else ''}")
        + " (engine: data.pin_memory=false): page-locking buys nothing without GPU copies",
        impact=0.0,
    )


def persistent_workers(ctx: CheckContext) -> Finding | None:
    restarting = [lo for lo in ctx.obs("dataloader")
                  if int(lo.get("num_workers") or 0) > 0 and not lo.get("persistent_workers")
                  and int(lo.get("iters") or 0) >= 2]
    if not restarting:
        return None
    seconds = sum(float(lo.get("iter_seconds") or 0.0) for lo in restarting)
    share = ctx.time_share(seconds)
    iters = sum(int(lo.get("iters") or 0) for lo in restarting)
    return Finding(
        id="persistent_workers",
        severity="warning" if share >= WORKER_RESTART_WARNING else "info",
        title="DataLoader workers are re-created every epoch",
        evidence=(f"{iters} iter() calls on loader(s) with workers and persistent_workers=False; "
                  f"starting them took {ms(seconds)} ({pct(share)} of the run)"),
        recommendation="DataLoader(..., persistent_workers=True) (engine: data.persistent_workers=true)",
        verify_with=ctx.tune_command("persistent_workers"),
        impact=share,
        basis="the time starting the workers, measured",
    )


def slow_host_to_device(ctx: CheckContext) -> Finding | None:
    if ctx.device_type != "cuda":
        return None
    share = ctx.share("h2d")
    if share < H2D_WARNING:
        return None
    transfers = ctx.first("transfers") or {}
    loader = ctx.train_loader() or {}
    evidence = (f"host-to-device copies take {pct(share)} of step time; {transfers.get('count', '?')} copies, "
                f"{transfers.get('non_blocking', 0)} non_blocking, {transfers.get('pinned', 0)}/"
                f"{transfers.get('checked', 0)} sampled sources pinned; DataLoader pin_memory={loader.get('pin_memory')}")
    return Finding(
        id="slow_host_to_device",
        severity="warning",
        title="Copies of the batch to the GPU stall the step",
        evidence=evidence,
        recommendation=("DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True) "
                        "(engine: data.pin_memory=true data.device_prefetch=true)"),
        verify_with=ctx.tune_command("pin_memory"),
        impact=share,
        basis="the time in host-to-device copies, measured",
    )


CHECKS = (data_bound, padding_waste, dataloader_workers, pin_memory_without_cuda, persistent_workers,
          slow_host_to_device)
