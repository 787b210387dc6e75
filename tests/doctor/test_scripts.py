"""End to end: each example script has one planted problem; the doctor must rank the matching
finding first, and find nothing at warning level in the healthy script."""
from __future__ import annotations

import builtins
import gc
import json

import pytest
import torch
from torch.nn.modules import module as module_mod
from torch.optim import optimizer as optim_mod
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from doctor_helpers import SCRIPTS, ids, script_findings, warnings_or_worse

pytestmark = pytest.mark.timeout(120)


def site(script: str, code: str) -> str:
    """`script:line` of the first line containing `code` (what the doctor should point at)."""
    for n, line in enumerate((SCRIPTS / script).read_text().splitlines(), start=1):
        if code in line:
            return f"{script}:{n}"
    raise AssertionError(f"{code!r} not in {script}")


def _patchable_state():
    return {
        "item": torch.Tensor.__dict__.get("item"), "to": torch.Tensor.__dict__.get("to"),
        "bool": torch.Tensor.__dict__.get("__bool__"), "backward": torch.Tensor.__dict__.get("backward"),
        "autograd.backward": torch.autograd.backward, "save": torch.save, "gc": gc.collect,
        "print": builtins.print, "iter": DataLoader.__dict__.get("__iter__"),
        "next": _BaseDataLoaderIter.__dict__.get("__next__"), "empty_cache": torch.cuda.empty_cache,
        "zero_grad": torch.optim.Optimizer.__dict__.get("zero_grad"),
        "fwd_hooks": len(module_mod._global_forward_hooks),
        "fwd_pre_hooks": len(module_mod._global_forward_pre_hooks),
        "opt_hooks": (len(optim_mod._global_optimizer_pre_hooks), len(optim_mod._global_optimizer_post_hooks)),
    }


def test_healthy_script_gets_no_warning(doctor):
    before = _patchable_state()
    result = doctor("healthy.py", steps=60, system_sampler=True)
    assert result.exit_code == 0 and result.stopped == "steps" and result.steps == 60
    assert warnings_or_worse(result) == [], result.findings
    assert _patchable_state() == before  # every patch and hook is gone
    report = json.loads((result.run_dir / "report.json").read_text())
    assert report["kind"] == "doctor" and report["traceback"] is None
    assert report["summary"]["steps"] == 60
    for name in ("steps.jsonl", "events.jsonl", "env.json", "config.yaml"):
        assert (result.run_dir / name).exists(), name
    assert "healthy.py" in (result.run_dir / "config.yaml").read_text()


def test_data_bound_loader(doctor):
    result = doctor("data_bound.py", steps=25)
    first = result.findings[0]
    assert first["id"] == "data_bound" and first["severity"] in ("warning", "critical")
    assert "num_workers=0" in first["evidence"] and "data.num_workers=" in first["recommendation"]
    assert first["verify_with"].startswith("trainspeed tune")


def test_padding_to_max_length(doctor):
    result = doctor("padding.py", steps=25)
    first = result.findings[0]
    assert first["id"] == "padding_waste"
    assert result.summary["pad_share"] == pytest.approx(0.9, abs=0.05)  # lengths 8..40 of 256
    assert "pad_id=0" in first["evidence"]
    # every batch is padded to 256: the fix is padding per batch (a script that already does
    # gets the grouping advice, test_checks.py)
    assert "pad each batch to its longest sequence" in first["recommendation"]
    assert "already padded" not in first["evidence"]


def test_growing_history_with_per_step_tensorboard(doctor, tmp_path):
    result = doctor("growing_log.py", "--logdir", str(tmp_path / "tb"), steps=150)
    assert ids(result)[0] == "step_time_growth", result.findings
    growth = result.findings[0]
    assert "other" in growth["evidence"] and "deque" in growth["recommendation"]
    assert "events.out.tfevents" in growth["evidence"]  # the TB file grew alongside
    assert "logging_overhead" in ids(result) or result.summary["phases"]["log"]["share"] > 0


def test_item_every_step_names_the_line(doctor):
    result = doctor("item_every_step.py", steps=40)
    first = script_findings(result.findings)[0]  # a CPU's info, below a busy machine's warning
    assert first["id"] == "host_syncs"
    assert site("item_every_step.py", "loss.item()") in first["evidence"] and "loss.item()" in first["recommendation"]
    assert result.summary["syncs_per_step"] == pytest.approx(1.0, abs=0.05)


def test_save_every_step(doctor, tmp_path):
    result = doctor("save_every_step.py", "--ckpt-dir", str(tmp_path / "ck"), steps=30)
    first = result.findings[0]
    assert first["id"] == "checkpointing" and first["title"] == "Checkpointing too often"
    assert site("save_every_step.py", "torch.save(") in first["evidence"] and "checkpoint.every_steps=" in first["recommendation"]
    events = [json.loads(line) for line in (result.run_dir / "events.jsonl").read_text().splitlines()]
    assert sum(e["type"] == "checkpoint" for e in events) == 29  # the 30th step stops before saving


def test_eval_every_step(doctor):
    result = doctor("eval_every_step.py", steps=30)
    first = result.findings[0]
    assert first["id"] == "evaluation_share" and first["impact"] > 0.3
    assert result.summary["phases"]["data"]["share"] < 0.05  # the val loader's wait counts as eval


def test_cache_and_gc_every_step(doctor):
    result = doctor("cache_gc.py", steps=8)
    first = script_findings(result.findings)[0]
    assert first["id"] == "cache_gc_in_loop"
    assert site("cache_gc.py", "gc.collect()  #") in first["evidence"]
    assert site("cache_gc.py", "    torch.cuda.empty_cache()") in first["evidence"]
    assert "host_syncs" not in ids(result)  # cache/GC calls have their own finding


def test_lightning_script_is_diagnosed(doctor):
    pytest.importorskip("lightning")
    result = doctor("lightning_script.py", steps=20)
    assert result.exit_code == 0 and result.steps == 20
    assert ids(result)[0] == "data_bound"
    events = [json.loads(line) for line in (result.run_dir / "events.jsonl").read_text().splitlines()]
    frameworks = [e["data"]["name"] for e in events if e["type"] == "observation" and e["data"]["kind"] == "framework"]
    assert frameworks == ["lightning"]


def test_crash_still_writes_report_and_keeps_exit_code(doctor):
    result = doctor("crash.py", "--crash-at", "12", steps=100)
    assert (result.exit_code, result.stopped, result.steps) == (1, "crash", 12)
    report = json.loads((result.run_dir / "report.json").read_text())
    assert "planted crash at step 12" in report["traceback"]
    assert report["summary"]["steps"] == 12 and report["doctor"]["exit_code"] == 1


def test_a_crash_before_any_step_is_the_first_finding(doctor):
    """A script that raises before its first step (dcgan/main.py without torchvision): the
    report's first finding is the crash and what gets past it, not 'no training step found'."""
    result = doctor("crash.py", "--crash-at", "0", steps=100)
    assert (result.exit_code, result.stopped, result.steps) == (1, "crash", 0)
    report = json.loads((result.run_dir / "report.json").read_text())
    first = report["findings"][0]
    assert first["id"] == "crashed_before_training" and "planted crash at step 0" in first["evidence"]
    # the message's terminal escapes are dropped (they showed as "[1m" in the report), and its
    # first line is the one shown
    line = "RuntimeError: planted crash at step 0. do this only if you trust it."
    assert report["doctor"]["error"] == line and first["evidence"].startswith(line + ";")
    assert "\x1b" not in report["traceback"] and "do this only if you trust it" in report["traceback"]


def test_sys_exit_code_is_preserved(doctor):
    result = doctor("crash.py", "--crash-at", "5", "--exit-code", "3", steps=100)
    assert (result.exit_code, result.stopped, result.steps) == (3, "exit", 5)
    assert json.loads((result.run_dir / "report.json").read_text())["traceback"] is None


def test_script_that_ends_before_the_step_limit(doctor):
    result = doctor("item_every_step.py", "--steps", "15", steps=200)
    assert (result.exit_code, result.stopped, result.steps) == (0, "end", 15)


def test_hf_trainer_script_is_diagnosed(doctor, tmp_path):
    pytest.importorskip("transformers")
    result = doctor("hf_trainer_script.py", "--out", str(tmp_path / "hf_out"), steps=12)
    assert result.exit_code == 0 and result.steps == 12, result
    assert ids(result)[0] == "padding_waste", result.findings
    events = [json.loads(line) for line in (result.run_dir / "events.jsonl").read_text().splitlines()]
    frameworks = [e["data"]["name"] for e in events if e["type"] == "observation" and e["data"]["kind"] == "framework"]
    assert frameworks == ["hf_trainer"]
    steps = [json.loads(line) for line in (result.run_dir / "steps.jsonl").read_text().splitlines()]
    shares = [s["pad_share"] for s in steps if s.get("pad_share") is not None]
    assert shares and min(shares) > 0.8  # 10-40 real tokens of 256
    # sync call sites point into the library that issues them, not at the user's .train() line
    rows = next(e["data"]["rows"] for e in events if e["type"] == "observation" and e["data"]["kind"] == "call_sites")
    syncs = [r["site"] for r in rows if r["category"] == "sync"]
    assert syncs and all("transformers" in s for s in syncs), syncs
    # ... and the fix names the Trainer setting behind the top one, not "edit line N"
    sync_finding = next(f for f in result.findings if f["id"] == "host_syncs")
    assert "inside transformers" in sync_finding["recommendation"]
    assert "logging_nan_inf_filter=False" in sync_finding["recommendation"], sync_finding


def test_lightning_prog_bar_reads_name_the_users_log_call(doctor):
    # Lightning's own examples/pytorch/basics/transformer.py: 2 reads a step inside Lightning
    # (fabric/utilities/apply_func.py `value.item()`), from `self.log(..., prog_bar=True)` in
    # its training_step; the advice was "look for the lightning option that reads a value"
    pytest.importorskip("lightning")
    result = doctor("lightning_prog_bar.py", steps=30)
    assert result.exit_code == 0 and result.steps == 30
    syncs = next(f for f in result.findings if f["id"] == "host_syncs")
    assert "apply_func.py" in syncs["evidence"]
    line = next(i for i, text in enumerate((SCRIPTS / "lightning_prog_bar.py").read_text().splitlines(), 1)
                if "# TRAIN LOG" in text)
    assert "set prog_bar=False in the `self.log(...)` of values logged every step" in syncs["recommendation"]
    assert syncs["recommendation"].endswith(f"for the progress bar; yours: lightning_prog_bar.py:{line})")
    # the script tuner learns the framework, so a precision win goes to L.Trainer(precision=...)
    from trainspeed.tune.script_facts import read_facts

    assert read_facts(result.run_dir).targets.framework == "lightning"
