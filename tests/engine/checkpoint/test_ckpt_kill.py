"""SIGKILL a process at random moments while it saves checkpoints in a loop, many times.

A helper process imports torch once and forks one short-lived trainer per round (so 24 rounds
cost one torch import). Each trainer resumes from `find_resumable`, trains and checkpoints every
step (alternating sync and async saves) and reports every checkpoint whose write completed; the
helper SIGKILLs it after a random delay and then checks the directory:

- find_resumable returns an intact checkpoint, at least as new as the newest reported one;
- no file under a final name is partial: every payload with a manifest verifies, a payload
  without one (killed between the two renames) still loads completely, every manifest parses;
- the `latest` pointer names an intact checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.timeout(240)

HELPER = textwrap.dedent(
    r'''
    import json, os, random, signal, sys, time
    import torch
    torch.set_num_threads(1)  # no OpenMP pool in the parent: forking stays safe
    from trainspeed.engine.checkpoint import (CheckpointManager, TrainState, build_checkpoint,
        find_resumable, restore_checkpoint, verify)
    from trainspeed.engine.checkpoint.atomic import is_temp_name, manifest_path
    from trainspeed.errors import CheckpointError

    directory, rounds, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)

    def make():
        model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def child(w, async_save):
        model, opt = make()
        report = lambda e: e["type"] == "checkpoint" and os.write(w, f"{e['ckpt_step']}\n".encode())
        mgr = CheckpointManager(directory, keep_last=2, keep_best=1, async_save=async_save,
                                on_event=report)
        step = 0
        path = mgr.find_resumable()
        if path is not None:
            step = restore_checkpoint(mgr.load(path), model, opt).step
        os.write(w, b"r")
        while True:
            step += 1
            loss = model(torch.randn(8, 128)).pow(2).mean()
            loss.backward(); opt.step(); opt.zero_grad()
            mgr.save(build_checkpoint(model, opt, counters=TrainState(step=step)), step,
                     {"val_loss": rng.random()})

    def check(newest_reported):
        errors, notes = [], {"temps": 0, "orphan_payloads": 0}
        names = os.listdir(directory)
        for name in names:
            full = os.path.join(directory, name)
            if is_temp_name(name):
                notes["temps"] += 1
            elif name.endswith(".pt"):
                if os.path.exists(full + ".json"):
                    try:
                        verify(full)
                    except CheckpointError as exc:
                        errors.append(f"partial file under a final name: {exc}")
                else:
                    notes["orphan_payloads"] += 1
                    try:
                        torch.load(full, weights_only=True)
                    except Exception as exc:
                        errors.append(f"{name}: payload without manifest does not load: {exc!r}")
            elif name.endswith(".json"):
                try:
                    json.loads(open(full).read())
                except ValueError:
                    errors.append(f"{name}: manifest is not complete JSON")
        found = find_resumable(directory)
        if newest_reported is not None:
            if found is None:
                errors.append(f"nothing resumable although step {newest_reported} was saved")
            elif int(os.path.basename(found)[5:13]) < newest_reported:
                errors.append(f"resumable {found} is older than reported step {newest_reported}")
        if os.path.exists(os.path.join(directory, "latest")):
            target = os.path.join(directory, open(os.path.join(directory, "latest")).read().strip())
            try:
                verify(target)
            except CheckpointError as exc:
                errors.append(f"latest pointer names a bad checkpoint: {exc}")
        return found, errors, notes

    # Warm the lazy imports (the first optimizer step pulls in torch._dynamo) once, before forking.
    _m, _o = make()
    _m(torch.randn(2, 128)).sum().backward(); _o.step()
    build_checkpoint(_m, _o)

    summary = {"kills": 0, "errors": [], "temps": 0, "orphan_payloads": 0, "steps": [], "max_step": 0}
    newest = None
    for i in range(rounds):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                child(w, async_save=bool(i % 2))
            finally:
                os._exit(1)
        os.close(w)
        if os.read(r, 1) != b"r":
            summary["errors"].append(f"round {i}: child died before it was ready")
        time.sleep(rng.uniform(0.02, 0.35))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        summary["kills"] += 1
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        os.close(r)
        reported = [int(x) for x in data.decode().split()]
        if reported:
            newest = max(reported)
        found, errors, notes = check(newest)
        summary["errors"] += [f"round {i}: {e}" for e in errors]
        summary["temps"] += notes["temps"]
        summary["orphan_payloads"] += notes["orphan_payloads"]
        summary["steps"].append(len(reported))
        summary["max_step"] = newest or 0
    print(json.dumps(summary))
    '''
)


def test_sigkill_during_saves_never_leaves_a_partial_checkpoint(tmp_path):
    from trainspeed.engine.checkpoint import CheckpointManager, restore_checkpoint

    script = tmp_path / "helper.py"
    script.write_text(HELPER)
    directory = tmp_path / "ck"
    proc = subprocess.run([sys.executable, str(script), str(directory), "24", "1234"],
                          capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["errors"] == []
    assert summary["kills"] == 24
    # The kills really landed during saves and the runs made progress across restarts.
    assert summary["temps"] + summary["orphan_payloads"] > 0, summary
    assert summary["max_step"] >= 24, summary

    mgr = CheckpointManager(directory)
    path = mgr.find_resumable()
    assert path is not None
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128))
    counters = restore_checkpoint(mgr.load(path), model, torch.optim.AdamW(model.parameters()))
    assert counters.step >= summary["max_step"]
