"""Tune trials: forked from the fork server vs started as new interpreters.

`trainspeed tune` runs every trial in its own process. Since this session a trial is forked
from a server that imported torch and the engine once (tune/forkserver.py) instead of
starting a new interpreter. This measures what that buys per trial: for each recipe, its
naive config shortened into a tune trial (session.trial_config, the tune's defaults: 5 warm-up
and 25 measured steps, a short evaluation), run alternately forked and fresh, and the wall time
of each trial, start to exit. The server's own start (once per tune) is reported apart. The
steady-state step time of both kinds must agree: the trial's figure must not depend on how its
process started.

The third side forks from a server that also imported what building the recipe imported in
this process (the tuner's preload: transformers' modeling code for hf).

    python benchmarks/trial_start.py [--recipes convnext,seqvae,gpt,hf] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import entry_commands, with_previous, write_result  # noqa: E402

from trainspeed.config import dump_config, load_config  # noqa: E402
from trainspeed.engine.from_recipe import load_target  # noqa: E402
from trainspeed.tune.forkserver import ForkServer  # noqa: E402
from trainspeed.tune.session import TrialLength, probe_recipe, trial_config  # noqa: E402
from trainspeed.tune.trials import SubprocessRunner, TrialRequest  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", default="convnext,seqvae,gpt,hf")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ts-trial-start-"))
    t0 = time.perf_counter()
    ForkServer().close()
    server_start_s = time.perf_counter() - t0
    print(f"  [trial_start] fork server start: {server_start_s:.2f} s", flush=True)
    results: dict[str, dict] = {}
    for recipe in args.recipes.split(","):
        base = root / f"{recipe}.yaml"
        cfg = load_target(recipe, [], "naive")
        dump_config(load_config(trial_config(cfg, TrialLength())), base)
        # What the tuner's server preloads: the modules building the recipe imports here.
        modules = probe_recipe(cfg).modules
        runners = {"forked": SubprocessRunner(base_config=base, out_dir=root / recipe / "forked"),
                   "fresh": SubprocessRunner(base_config=base, out_dir=root / recipe / "fresh", fork_server=False),
                   "preloaded": SubprocessRunner(base_config=base, out_dir=root / recipe / "preloaded",
                                                 preload=modules)}
        t1 = time.perf_counter()
        runners["preloaded"]._start_server()
        preload_start_s = time.perf_counter() - t1
        runners["forked"]._start_server()  # started once per tune, before its first trial's clock
        kinds = tuple(runners)
        walls: dict[str, list[float]] = {k: [] for k in kinds}
        steps: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                res = runners[kind](TrialRequest(key=kind, label="baseline", overrides=(), repeat=r))
                if not res.ok:
                    raise SystemExit(f"{recipe} {kind} trial failed: {res.error}")
                walls[kind].append(res.wall_s)
                steps[kind].append(statistics.median(res.step_times))
                print(f"  [trial_start] {recipe} round {r + 1} {kind}: {res.wall_s:.2f} s, "
                      f"median step {steps[kind][-1] * 1e3:.1f} ms", flush=True)
        for runner in runners.values():
            runner.close()
        fw, nw = statistics.median(walls["forked"]), statistics.median(walls["fresh"])
        pw = statistics.median(walls["preloaded"])
        results[recipe] = {"forked_wall_s": fw, "fresh_wall_s": nw, "saved_s": nw - fw,
                           "preloaded_wall_s": pw, "preloaded_modules": len(modules),
                           "preloaded_server_start_s": preload_start_s,
                           "forked_step_ms": statistics.median(steps["forked"]) * 1e3,
                           "fresh_step_ms": statistics.median(steps["fresh"]) * 1e3,
                           "preloaded_step_ms": statistics.median(steps["preloaded"]) * 1e3,
                           "walls": walls, "step_medians_s": steps}
        print(f"{recipe}: trial {nw:.2f} s fresh -> {fw:.2f} s forked ({nw - fw:.2f} s saved) -> {pw:.2f} s "
              f"forked with the recipe's {len(modules)} modules preloaded (server start {preload_start_s:.1f} s); "
              f"median step {results[recipe]['fresh_step_ms']:.1f} vs {results[recipe]['forked_step_ms']:.1f} vs "
              f"{results[recipe]['preloaded_step_ms']:.1f} ms", flush=True)
    for recipe in args.recipes.split(","):
        results[recipe]["command"] = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    results["server_start_s"] = server_start_s
    results = with_previous("trial_start", results)  # each earlier entry keeps its command
    label = ", ".join(f"{r} {v['fresh_wall_s']:.1f} -> {v['forked_wall_s']:.1f}"
                      + (f" -> {v['preloaded_wall_s']:.1f}" if "preloaded_wall_s" in v else "") + " s"
                      for r, v in results.items() if isinstance(v, dict))
    command = entry_commands(results, default="python benchmarks/trial_start.py")
    write_result("trial_start", results, command=command, headline={
        "label": f"Tune trial wall time, new interpreter -> forked from the fork server [-> forked, the "
                 f"recipe's modules preloaded] (median of {args.rounds} alternated; server start "
                 f"{server_start_s:.1f} s once per tune)",
        "value": label, "goal": None, "passed": None})


if __name__ == "__main__":
    main()
