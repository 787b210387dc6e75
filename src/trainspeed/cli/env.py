"""`trainspeed env [--json] [--precision P] [--measure-peak]`: the machine facts behind every
measurement, and what they mean for which speed switches can help here."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "env",
        help="show versions, devices, CPU features and what they mean for speed",
        description="Print the environment facts written to env.json (versions, devices, CPU bf16 "
                    "units, cores, peak FLOP/s) and which speed switches can help on this machine.",
    )
    parser.add_argument("--json", action="store_true", help="print the env.json document instead of tables")
    parser.add_argument("--precision", metavar="P", default=None,
                        help="also name the MFU peak for this precision (fp32, tf32, bf16-mixed, fp16-mixed)")
    parser.add_argument("--measure-peak", action="store_true",
                        help="name the measured matmul peak when the device is not in the datasheet table "
                             "(CPUs, unknown GPUs): timed once per machine (a few seconds) and cached in "
                             "$XDG_CACHE_HOME/trainspeed/peaks.json; TRAINSPEED_REMEASURE_PEAK=1 times it again")
    parser.set_defaults(run=run)


def _cache_note(peak: dict[str, Any]) -> str:
    """Where a measured peak came from: the per-machine cache (and when it was timed), or now."""
    if peak.get("source") != "measured" or "measured_at" not in peak:  # a table row, or an old env.json
        return ""
    import time

    from trainspeed.telemetry.peak_cache import CACHE_FILE, REMEASURE_ENV, cache_dir

    when = peak.get("measured_at")
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime(when)) if isinstance(when, (int, float)) else "at an unknown time"
    where = "from the cache" if peak.get("cached") else "timed now, cached"
    if peak.get("quiet") is False:
        return (f"; {where} ({cache_dir() / CACHE_FILE}, measured {stamp}) while the matmul got fewer "
                "cores than its threads (other processes held them), so it may be low: each run times it "
                "again and keeps the highest figure until a timing gets the cores")
    return (f"; {where} ({cache_dir() / CACHE_FILE}, measured {stamp}): every run on this machine uses this "
            f"figure; {REMEASURE_ENV}=1 measures again")


def run(args: argparse.Namespace) -> int:
    import json

    from trainspeed.telemetry.env import collect_env

    precision = args.precision
    if precision is None and args.measure_peak:
        precision = "fp32"
    env = collect_env(precision=precision, measure_peak=args.measure_peak)
    if args.json:
        print(json.dumps(env, indent=2, default=str))
        return 0
    from trainspeed.rich_console import new_console

    render(env, new_console())
    return 0


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def _tflops(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e12:g}"


def _version_at_least(version: str, major: int, minor: int) -> bool:
    try:
        parts = version.split("+")[0].split(".")
        return (int(parts[0]), int(parts[1])) >= (major, minor)
    except (IndexError, ValueError):
        return False


def usable_cores(env: dict[str, Any]) -> int | None:
    """Cores this process may really use: affinity mask, capped by a container CPU quota."""
    cpu = env.get("cpu") or {}
    cores = cpu.get("available_cores") or cpu.get("logical_cores")
    quota = cpu.get("quota")
    if cores is None:
        return None
    if quota:
        cores = max(1, min(int(cores), int(quota)))
    return int(cores)


def advice(env: dict[str, Any]) -> list[tuple[str, str]]:
    """(topic, explanation) pairs: which switches can help on this machine, and why. Pure."""
    out: list[tuple[str, str]] = []
    cpu = env.get("cpu") or {}
    devices = env.get("devices") or []
    flags = cpu.get("flags") or {}

    # Reduced precision on CPU
    if cpu.get("bf16_fast"):
        units = " and ".join(f for f in ("amx_bf16", "avx512_bf16") if flags.get(f))
        out.append(("bf16 on CPU", f"this CPU has native bf16 units ({units}): bf16-mixed autocast can speed up "
                                   "matmul-heavy models on CPU. Confirm with `trainspeed tune`."))
    else:
        out.append(("bf16 on CPU", "this CPU has no bf16 units (no avx512_bf16 / amx_bf16): bf16 autocast is "
                                   "emulated and usually much slower than fp32. Keep precision fp32 when "
                                   "training on this CPU."))

    # Precision on GPUs
    for d in devices:
        major = int(str(d.get("capability", "0.0")).split(".")[0] or 0)
        if major >= 8:
            text = "bf16-mixed and TF32 run on tensor cores here: use bf16-mixed (no GradScaler needed), and TF32 for fp32 matmuls."
        elif major >= 7:
            text = "tensor cores take fp16 only (no bf16/TF32 units): use fp16-mixed with a GradScaler; bf16 would be emulated."
        else:
            text = "no tensor cores: mixed precision saves memory but gives little speed."
        out.append((f"precision on GPU {d.get('index')}", f"{d.get('name')} (sm {d.get('capability')}): {text}"))

    # Fused optimizers
    torch_version = str(env.get("torch") or "")
    if devices:
        out.append(("fused optimizer", "CUDA is available: fused Adam/AdamW/SGD (one kernel for all parameters "
                                       "instead of several per tensor) usually cut optimizer time a lot."))
    elif _version_at_least(torch_version, 2, 4):
        out.append(("fused optimizer", "the big win of fused optimizers (fewer kernel launches) needs CUDA. This "
                                       f"torch ({torch_version}) also has fused Adam/AdamW/SGD on CPU; the gain "
                                       "there is smaller - measure it."))
    else:
        out.append(("fused optimizer", "fused optimizers need CUDA with this torch version; on CPU use the "
                                       "default (foreach) implementation."))

    # DataLoader workers vs cores
    cores = usable_cores(env)
    threads = cpu.get("torch_threads")
    if cores is not None:
        quota = cpu.get("quota")
        limit = f" (container CPU quota {quota:g})" if quota else ""
        if cores <= 2:
            text = (f"only {cores} usable cores{limit}: DataLoader workers compete with the training process for "
                    "them. Try num_workers=1 and measure against 0; prefer cheap preprocessing.")
        else:
            text = (f"{cores} usable cores{limit}: the training process needs at least one; num_workers up to "
                    f"{cores - 1} is the useful range (more workers than cores only adds contention).")
        if threads and threads > cores:
            text += f" torch uses {threads} threads on {cores} cores: oversubscribed; set torch.set_num_threads({cores})."
        out.append(("DataLoader workers", text))

    # Peak FLOP/s used for MFU
    peak = env.get("peak_flops")
    if isinstance(peak, dict) and peak.get("flops"):
        how = "vendor datasheet, dense" if peak.get("source") == "table" else "measured matmul on this machine"
        out.append(("MFU peak", f"MFU is reported against {peak.get('name')} {peak.get('dtype')}: "
                                f"{peak['flops'] / 1e12:.3g} TFLOP/s ({how}){_cache_note(peak)}."))
    for d in devices:
        peaks = d.get("peak_flops") or {}
        if any(peaks.values()):
            listed = ", ".join(f"{k} {_tflops(v)}" for k, v in peaks.items())
            out.append((f"MFU peak GPU {d.get('index')}", f"datasheet dense peaks in TFLOP/s: {listed}."))
        else:
            out.append((f"MFU peak GPU {d.get('index')}", f"{d.get('name')} is not in the peak table: MFU uses a "
                                                          "measured matmul peak (labelled 'measured')."))
    if not devices and not (isinstance(peak, dict) and peak.get("flops")):
        out.append(("MFU peak", "CPUs have no datasheet peak here: MFU is computed against a measured matmul "
                                "peak (see it with `trainspeed env --measure-peak`)."))

    if devices and not env.get("nvml"):
        out.append(("GPU sampling", "NVML is not available: install trainspeed[nvml] (nvidia-ml-py) to record "
                                    "GPU utilization, power and clocks during runs."))
    return out


def render(env: dict[str, Any], console) -> None:
    from rich.table import Table

    cpu = env.get("cpu") or {}
    facts = Table(title="trainspeed env", show_header=False, title_justify="left")
    facts.add_column("fact", style="bold")
    facts.add_column("value")
    facts.add_row("python", f"{env.get('python')} ({env.get('platform')})")
    facts.add_row("torch", f"{env.get('torch')}  cuda {env.get('cuda') or '-'}  cudnn {env.get('cudnn') or '-'}")
    facts.add_row("trainspeed", str(env.get("trainspeed")))
    facts.add_row("host", f"{env.get('hostname')}  memory {_gib(env.get('host_memory'))}")
    facts.add_row("cpu", str(cpu.get("model")))
    quota = cpu.get("quota")
    facts.add_row(
        "cores",
        f"{cpu.get('physical_cores')} physical, {cpu.get('logical_cores')} logical, "
        f"{cpu.get('available_cores')} available" + (f", quota {quota:g}" if quota else "")
        + f"; torch threads {cpu.get('torch_threads')}",
    )
    flags = cpu.get("flags") or {}
    facts.add_row("cpu features", f"capability {cpu.get('capability')}; "
                  + " ".join(f"{k}{'+' if v else '-'}" for k, v in flags.items())
                  + f"; bf16 fast: {'yes' if cpu.get('bf16_fast') else 'no'}")
    facts.add_row("nvml", "yes" if env.get("nvml") else "no")
    slurm = env.get("slurm")
    if isinstance(slurm, dict):  # a train run saves, requeues and continues on SIGUSR1 (docs/faults.md)
        facts.add_row("slurm", f"job {slurm.get('job_id')}, restart {slurm.get('restart')} (trainspeed train "
                               "saves and requeues on SIGUSR1: docs/faults.md)")
    console.print(facts)

    devices = env.get("devices") or []
    if devices:
        table = Table(title="GPUs", title_justify="left")
        for col in ("#", "name", "memory", "sm", "fp32", "tf32", "bf16", "fp16 (TFLOP/s, datasheet dense)"):
            table.add_column(col)
        for d in devices:
            p = d.get("peak_flops") or {}
            table.add_row(str(d.get("index")), str(d.get("name")), _gib(d.get("memory_total")), str(d.get("capability")),
                          _tflops(p.get("fp32")), _tflops(p.get("tf32")), _tflops(p.get("bf16")), _tflops(p.get("fp16")))
        console.print(table)
    else:
        console.print("GPUs: none (CUDA not available)")

    console.print()
    console.print("[bold]What this means[/bold]")
    for topic, text in advice(env):
        console.print(f"  [bold]{topic}[/bold]: {text}")
