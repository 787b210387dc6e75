"""Where the time goes: one statement at the top of every report, before the findings.

Findings name problems, ranked by the time at stake; a run whose time is mostly the model's own
arithmetic has few, and its first one could be "[INFO] num_workers=0 ~10 %" while nothing said
that compute took 79 % of the step and what can still help there (an image classifier on a
CPU: backward 46 %, forward 33 %, data 10 %). The statement sorts the step's measured time into
three kinds, each with what can still help:

- data: waiting for the batch and copying it to the device (phases data, h2d);
- overhead: the host's own work around the training phases (logging, checkpoints, evaluation,
  the loop's Python between phases: log, ckpt, eval, other), or, on a GPU whose training
  phases run far below its peak (MFU under LAUNCH_MFU), the launching of small kernels;
- compute: forward, backward and the optimizer's update.

The largest kind is the bound. Pure: shares from the summary, facts from the observations.
"""

from __future__ import annotations

from typing import Any

from trainspeed.doctor.checks.context import CheckContext, describe_site, pct
from trainspeed.doctor.checks.data import DATA_WAIT_WARNING, padded_per_batch, padding_share
from trainspeed.doctor.checks.lookups import SHARE_INFO, lookup_time, steps_enough
from trainspeed.doctor.checks.machine import busy_machine
from trainspeed.doctor.checks.optimizer_kernels import optimizer_not_fused
from trainspeed.doctor.checks.rollout import ROLLOUT_HELPS, is_rollout
from trainspeed.doctor.checks.script_flags import script_padding_flag
from trainspeed.doctor.checks.threads import oversubscribed

DATA = ("data", "h2d")
OVERHEAD = ("log", "ckpt", "eval", "other")
COMPUTE = ("forward", "backward", "optimizer")
WORK_SHARE = 0.02
"""Logging, checkpointing or evaluation under 2 % of the step is no lead for an overhead-bound
run: pytorch/examples' reinforce.py (log 0.0 %, no eval, 86 % "other": the environment's steps)
was told to log and evaluate less often and to measure `--knobs log_every,eval_every`."""
LAUNCH_MFU = 0.05
"""Training phases at under 5 % of a GPU's peak are launch- or host-bound work, not arithmetic
(the doctor's low_gpu_utilization reads the same MFU)."""


def _helps(ctx: CheckContext, bound: str, launch: bool, unfused: bool) -> list[str]:
    loader = ctx.train_loader() or {}
    if bound == "data" and _rollout_leads(ctx):
        env = env_steps(ctx)
        if env is None:  # the PPO example's CartPole steps: 47 ms of the run; worker processes win nothing
            return [h for h in ROLLOUT_HELPS if "AsyncVectorEnv" not in h]
        return [f"{env[0]}, inside the rollout", *ROLLOUT_HELPS]
    if bound == "data":
        workers = loader.get("num_workers")
        more = (f"DataLoader workers (now {workers}, {ctx.cores} cores)" if isinstance(workers, int)
                else "building batches in DataLoader workers")
        return [more, "less work per sample in __getitem__ (decode once, cache, cheaper transforms)",
                "pin_memory with non_blocking copies on a GPU",
                "a faster model changes nothing until the data keeps up"]
    helps = _waiting_helps(ctx)
    if bound == "overhead" and launch:
        return helps + ["a larger batch (more work per kernel launch)",
                        "torch.compile (fewer, fused kernels; mode=reduce-overhead adds CUDA graphs)",
                        "no host reads of device values inside the step (.item(), printing tensors)"]
    if bound == "overhead":
        named = [word for phase, word in (("log", "logging"), ("ckpt", "checkpointing"), ("eval", "evaluation"))
                 if ctx.share(phase) >= WORK_SHARE]
        if named:
            words = ", ".join(named[:-1]) + (" and " if len(named) > 1 else "") + named[-1]
            helps.append(f"{words} less often (the findings below name their lines)")
        env = env_steps(ctx)
        if env is not None and not named:
            # reinforce.py: CartPole's steps were 5 % of the time, "other" 57 %: most of it is the
            # loop's own Python around them (a distribution per action, per-step tensors)
            rest = ctx.share("other") - env[1]
            helps.append(env[0] + (f"; the other {pct(rest)} outside the training phases is the loop's own Python "
                                   "around them (per-step tensors, a distribution per action, bookkeeping)"
                                   if rest >= WORK_SHARE else ""))
            helps.append("vectorized environments (one batched forward for N environments' states) and "
                         "gymnasium's AsyncVectorEnv (stepping them in worker processes) do more per call")
            return helps
        helps.append("moving Python work out of the step (bookkeeping over growing lists, per-step conversions)"
                     if named or ctx.share("other") < WORK_SHARE else
                     f"less Python work between the training phases ({pct(ctx.share('other'))} of the step "
                     "ran outside forward, backward, the update, logging, checkpoints and evaluation: what "
                     "the loop computes itself, an environment's steps, bookkeeping over growing lists, "
                     "per-step conversions); batching it (one forward over many inputs, vectorized "
                     "environments) does more per call")
        lookups = ctx.time_share(lookup_time(ctx)[1])
        if lookups >= SHARE_INFO and steps_enough(ctx):  # as the finding it points to
            helps.insert(len(helps) - 2, f"caching the package lookups a library makes at every step "
                                         f"({pct(lookups)} of the time: the finding below writes the line)")
        return helps
    cpu = (ctx.run.env or {}).get("cpu") if isinstance(ctx.run.env, dict) else None
    no_bf16 = ctx.device_type == "cpu" and isinstance(cpu, dict) and cpu.get("bf16_fast") is False
    precision = ctx.precision
    pad = padding_share(ctx)
    if pad is not None:
        # run_glue_no_trainer.py --pad_to_max_length: 69 % of the positions were padding and this
        # line offered bf16 and compile only; less padding removes that share of the arithmetic
        helps.append(f"less padding ({pct(pad)} of the token positions are padding: the padding finding "
                     "below names the change)")
    if precision == "fp64":
        helps.append("float32 in place of float64 (the fp64 finding below; autocast leaves float64 as it is)")
    elif precision == "fp32" and not any(m.get("autocast") for m in ctx.models()):
        helps.append("bf16 autocast (this CPU has no bf16 units: it would be emulated, slower)" if no_bf16
                     else "lower precision where the device has units for it (bf16 autocast)")
    if unfused:
        # a newcomer's script: the optimizer step was 25 % of the step, its finding first, and
        # this line (and its tune command) offered only bf16 and compile
        helps.append(f"a fused optimizer step (the optimizer is {pct(ctx.share('optimizer'))} of the step: "
                     "the optimizer finding below)")
    if not any(m.get("compiled") for m in ctx.models()):
        helps.append("torch.compile (fuses the elementwise ops between the matmuls)")
    if any(m.get("convolutional") for m in ctx.models()):
        helps.append("channels_last memory format for the convolutions")
    if ctx.device_type == "cpu":
        helps.append("compute threads matched to the free cores")
    helps += ["a smaller or cheaper model", "a faster device"]
    return helps


UNSEEN_FORWARD = "the forward outside module calls, timed as other"


def _forwards_unseen(ctx: CheckContext) -> bool:
    """Backwards ran but nearly no training forward went through a module call (pytorch/examples'
    mnist_forward_forward calls `self.forward(x)`: 45 % of its step read as "other", overhead)."""
    seen = ctx.first("step_boundary") or {}
    forwards, backwards = int(seen.get("forwards") or 0), int(seen.get("backwards") or 0)
    return backwards >= 3 and forwards < 0.5 * backwards


def _data_wait(ctx: CheckContext) -> float | None:
    """The share of the step spent waiting for the next batch when the data finding warns of
    it (DATA_WAIT_WARNING) though the step is bound elsewhere, else None."""
    share = ctx.share("data")
    return share if share >= DATA_WAIT_WARNING else None


def _waiting_helps(ctx: CheckContext) -> list[str]:
    # pytorch/examples' mnist on the CPU: compute-bound at 86 %, but the step waited 13 % for
    # its batch (num_workers=0), the one warning below, and this line offered bf16 and compile
    wait = _data_wait(ctx)
    if wait is None or ctx.train_loader() is None:
        # no DataLoader to give workers (pytorch/examples' regression builds each batch itself):
        # this line offered them, and its `tune --knobs num_workers` refused to run (exit 3)
        return []
    workers = (ctx.train_loader() or {}).get("num_workers")
    now = f" (now {workers})" if isinstance(workers, int) else ""
    return [f"DataLoader workers{now} for the {pct(wait)} of the step spent waiting for the next batch "
            "(the data finding below)"]


def _rollout_leads(ctx: CheckContext) -> bool:
    """An RL rollout (rollout.py) whose time is at least the data loader's: the data is collected
    experience, and its helps, statement and tunes are the rollout's, not the DataLoader's."""
    return is_rollout(ctx) and ctx.share("eval") >= sum(ctx.share(p) for p in DATA)


def env_steps(ctx: CheckContext) -> tuple[str, float] | None:
    """('the environment's steps take 5% of the time (`env.step(action)` at reinforce.py:89, 109
    calls a step)', that share) when a gymnasium/gym environment's steps took WORK_SHARE of the
    run's time (instrument/environments.py), else None."""
    total = ctx.site_totals("env").get("step") or {}
    share = ctx.time_share(float(total.get("seconds") or 0.0))
    if share < WORK_SHARE:
        return None
    rows = ctx.sites("env")
    where = f"{describe_site(rows[0])}, " if rows else ""
    per_step = (total.get("count") or 0) / ctx.steps if ctx.steps else 0
    return f"the environment's steps take {pct(share)} of the time ({where}{per_step:.0f} calls a step)", share


def where_time_goes(ctx: CheckContext) -> dict[str, Any] | None:
    """{bound, shares {data, overhead, compute}, mfu, statement, helps, verify_with}, or None
    for a run without timed phases."""
    # Forwards no module call showed (`layer.forward(h)` called directly, a model compiled in
    # place) leave their time in "other": it is the step's compute, not host overhead
    unseen = _forwards_unseen(ctx)
    overhead, compute = (OVERHEAD, COMPUTE) if not unseen else (
        tuple(p for p in OVERHEAD if p != "other"), (*COMPUTE, "other"))
    # an RL rollout's no-grad forwards and environment steps, timed as "eval": the data (rollout.py)
    rollout = is_rollout(ctx)
    data = (*DATA, "eval") if rollout else DATA
    if rollout:
        overhead = tuple(p for p in overhead if p != "eval")
    shares = {"data": sum(ctx.share(p) for p in data), "overhead": sum(ctx.share(p) for p in overhead),
              "compute": sum(ctx.share(p) for p in compute)}
    if sum(shares.values()) <= 0:
        return None
    mfu = ctx.summary.get("mfu") or {}
    mfu_value = mfu.get("value") if mfu.get("valid") else None
    bound = max(shares, key=shares.get)  # type: ignore[arg-type]
    launch = (bound == "compute" and ctx.device_type == "cuda" and isinstance(mfu_value, (int, float))
              and mfu_value < LAUNCH_MFU)
    if launch:
        bound = "overhead"
    names = {"other": UNSEEN_FORWARD} if unseen else {}
    if rollout:
        names["eval"] = "rollout"
    parts = {kind: ", ".join(f"{names.get(p, p)} {pct(ctx.share(p))}" for p in phases if ctx.share(p) >= 0.005)
             for kind, phases in (("data", data), ("overhead", overhead), ("compute", compute))}
    what = {"data": "waiting for data", "overhead": "the host's own work around the training phases",
            "compute": "the model's forward, backward and update"}[bound]
    if bound == "data" and _rollout_leads(ctx):
        what = ("collecting experience (the rollout: the policy's no-grad forwards in train() mode and the "
                "environments' steps between updates)")
    if launch:
        what = f"launching small GPU kernels (the training phases run at {pct(mfu_value)} of the GPU's peak)"
    peak = f" ({mfu['peak_name']})" if mfu.get("peak_name") else ""
    at_peak = (f" at {pct(mfu_value)} of the peak{peak}"
               if bound == "compute" and isinstance(mfu_value, (int, float)) else "")
    rest = "; ".join(f"{kind} {pct(shares[kind])} ({parts[kind]})" for kind in ("data", "overhead", "compute")
                     if kind != ("compute" if launch else bound) and parts[kind])
    statement = (f"{bound}-bound: {pct(shares['compute'] if launch else shares[bound])} of the step is {what}"
                 f"{at_peak} ({parts['compute' if launch else bound]})" + (f"; {rest}" if rest else ""))
    busy = busy_machine(ctx) if ctx.device_type == "cpu" and not ctx.summary.get("contention") else None
    if busy is not None:
        # nanoGPT beside a neighbour on 2 cores: "compute-bound: 90 % of the step is the model's
        # forward, backward and update at 0.3 % of cpu" (55x its quiet step), with no word of why
        statement += (f"; other processes held {busy['others']:.1f} of the {busy['cores']} cores meanwhile: these "
                      "are the busy machine's times, not the script's (machine_busy below)")
    work = tuple(topic for phase, topic in (("log", "logging"), ("ckpt", "checkpoint"), ("eval", "eval"))
                 if ctx.share(phase) >= WORK_SHARE)
    loader = ctx.train_loader() is not None  # num_workers has nothing to vary without a DataLoader
    topics = {"data": () if _rollout_leads(ctx) or not loader else ("num_workers",),
              "overhead": ("compile", "batch_size") if launch else work,
              "compute": ("precision", "compile")}[bound]
    unfused = bound == "compute" and optimizer_not_fused(ctx) is not None
    if unfused:
        topics = (*topics, "fused_optimizer")
    if bound == "compute" and padding_share(ctx) is not None and script_padding_flag(ctx, padded_per_batch(ctx)):
        topics = ("padding_flag", *topics)
    if bound != "data" and _data_wait(ctx) is not None and loader:
        topics = ("num_workers", *topics)
    if any(m.get("compiled") for m in ctx.models()):  # the tune's compile skips a compiled model
        topics = tuple(t for t in topics if t != "compile")
    if ctx.precision == "fp64":  # autocast leaves float64 as it is: nothing to try
        topics = tuple(t for t in topics if t != "precision")
    over = oversubscribed(ctx)
    if (over is not None and over[1] > 1) or (busy is not None and (busy.get("threads") or 0) > 1):
        topics = ("threads", *topics)  # threads beyond the free cores spin (threads.py, machine.py)
    helps = _helps(ctx, bound, launch, unfused)
    if busy is not None:
        helps.insert(0, "measuring on a quiet machine (or cores of the run's own)")
    if _forwards_unseen(ctx) and not any(m.get("trained_by") for m in ctx.models()):
        # the tune's precision and compile settings apply at module calls: with none to see
        # (mnist_forward_forward), its trials skip them ("no trained module was seen")
        topics = tuple(t for t in topics if t not in ("precision", "compile"))
        helps.insert(0, "calling the module (`layer(x)`), not its `forward` (`layer.forward(x)`): no module call "
                        "ran the training forward (it was called directly), and module "
                        "calls are what hooks, autocast and compile settings (and the tune's trials) see")
    return {"bound": bound, "shares": shares, "mfu": mfu_value, "statement": statement,
            "helps": helps, "verify_with": ctx.tune_command(*topics) if topics else None}


def time_goes(run: Any, summary: dict[str, Any]) -> dict[str, Any] | None:
    """where_time_goes of a read run directory (the doctor writes it to report.json)."""
    from trainspeed.doctor.checks.run_kinds import as_diagnosed

    return where_time_goes(CheckContext.from_run(as_diagnosed(run), summary))


def format_time_goes(found: dict[str, Any] | None) -> str:
    """Two lines for a report's top: the statement, and what can still help."""
    if not found:
        return ""
    text = f"Where the time goes: {found['statement']}.\nWhat can still help: {'; '.join(found['helps'])}."
    if found.get("verify_with"):
        text += f"\nMeasure it: {found['verify_with']}"
    if found.get("tuned"):  # what a tune of this script measured of those knobs (doctor/tuned.py)
        text += f"\nMeasured: {found['tuned']}"
    return text
