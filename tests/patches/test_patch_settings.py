"""The settings registry, validation, install/uninstall, and the process-wide switches."""

from __future__ import annotations

import builtins
import gc
import json

import pytest
import torch
from torch.utils.data import DataLoader

from trainspeed.errors import ConfigError
from trainspeed.patches import SETTINGS, Applied, install_settings, validate_settings

pytestmark = pytest.mark.timeout(120)

ALL = {
    "loader.num_workers": 2, "loader.pin_memory": True, "loader.persistent_workers": True,
    "loader.prefetch_factor": 4, "precision": "fp16", "compile": "default", "channels_last": True,
    "optimizer.impl": "fused", "threads": 1, "cuda.tf32": True, "cuda.cudnn_benchmark": True,
    "cuda.expandable_segments": True,
    "hf.attn_implementation": "sdpa", "whatif.log_every": 5, "whatif.save_every": 5, "whatif.no_gc": True,
    "whatif.gc_every": 5, "code.log_every": 5, "code.save_every": 5, "code.gc_every": 5,
    "runtime.cache_checks": ["platform.python_version"],
}


def test_registry_has_every_key_with_a_description():
    assert set(ALL) == set(SETTINGS)
    for key, spec in SETTINGS.items():
        assert spec.help and callable(spec.install), key


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(ConfigError, match="did you mean 'loader.num_workers'"):
        validate_settings({"loader.num_worker": 2})
    with pytest.raises(ConfigError, match="did you mean 'precision'"):
        validate_settings({"precison": "bf16"})


@pytest.mark.parametrize("key,value,message", [
    ("loader.num_workers", -1, "setting loader.num_workers must be an int >= 0, got -1"),
    ("loader.num_workers", True, "must be an int >= 0, got True"),
    ("loader.prefetch_factor", 0, "an int >= 1, got 0"),
    ("loader.pin_memory", "yes", "true or false, got 'yes'"),
    ("precision", "fp8", "'bf16' or 'fp16', got 'fp8'"),
    ("compile", "fast", "'default', 'reduce-overhead' or 'max-autotune'"),
    ("optimizer.impl", "apex", "'fused' or 'foreach'"),
    ("threads", 0, "an int >= 1, got 0"),
    ("whatif.log_every", 1, "an int >= 2, got 1"),
    ("hf.attn_implementation", "flash", "'sdpa', 'eager' or 'flash_attention_2'"),
])
def test_bad_values_are_rejected_with_the_full_key(key, value, message):
    with pytest.raises(ConfigError) as info:
        validate_settings({key: value})
    assert message in str(info.value)


def test_script_flags_and_good_values_pass():
    validate_settings({**ALL, "args.--workers": 4, "args.compile": True, "hf.attn_implementation": "flash_attention_2"})


def test_install_validates_before_installing_anything():
    original = DataLoader.__init__
    with pytest.raises(ConfigError):
        install_settings({"loader.num_workers": 2, "threads": -3}, say=lambda t: None)
    assert DataLoader.__init__ is original


def test_uninstall_restores_every_patched_attribute_twice():
    originals = {
        "DataLoader.__init__": DataLoader.__dict__["__init__"], "print": builtins.print, "save": torch.save,
        "gc.collect": gc.collect, "empty_cache": torch.cuda.empty_cache, "backward": torch.Tensor.backward,
        "Optimizer.__init__": torch.optim.Optimizer.__dict__["__init__"],
        "AdamW.__init__": torch.optim.AdamW.__dict__["__init__"], "set_num_threads": torch.set_num_threads,
    }
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    threads = torch.get_num_threads()
    suppress = torch._dynamo.config.suppress_errors
    hooks = dict(torch.nn.modules.module._global_forward_pre_hooks)
    for _ in range(2):
        # code.* edit recorded call sites of a file (test_edited_source.py restores those)
        applied = install_settings({k: v for k, v in ALL.items() if not k.startswith("code.")}, say=lambda t: None)
        assert isinstance(applied, Applied)
        assert DataLoader.__init__ is not originals["DataLoader.__init__"] and torch.save is not originals["save"]
        assert torch.get_num_threads() == 1
        assert torch.backends.cudnn.benchmark is True and torch._dynamo.config.suppress_errors is True
        applied.uninstall()
        now = {
            "DataLoader.__init__": DataLoader.__dict__["__init__"], "print": builtins.print, "save": torch.save,
            "gc.collect": gc.collect, "empty_cache": torch.cuda.empty_cache, "backward": torch.Tensor.backward,
            "Optimizer.__init__": torch.optim.Optimizer.__dict__["__init__"],
            "AdamW.__init__": torch.optim.AdamW.__dict__["__init__"], "set_num_threads": torch.set_num_threads,
        }
        assert all(now[k] is originals[k] for k in originals), [k for k in originals if now[k] is not originals[k]]
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
                torch.backends.cudnn.benchmark) == flags
        assert torch.get_num_threads() == threads
        assert torch._dynamo.config.suppress_errors == suppress
        assert dict(torch.nn.modules.module._global_forward_pre_hooks) == hooks


def test_a_failing_install_undoes_the_settings_before_it(monkeypatch):
    def broken(value, ctx):
        raise RuntimeError("boom")

    spec = SETTINGS["cuda.tf32"]
    monkeypatch.setitem(SETTINGS, "cuda.tf32", type(spec)(check=spec.check, allowed=spec.allowed,
                                                          install=broken, help=spec.help))
    original = DataLoader.__init__
    with pytest.raises(RuntimeError, match="boom"):
        install_settings({"loader.num_workers": 1, "cuda.tf32": True}, say=lambda t: None)
    assert DataLoader.__init__ is original


def test_threads_set_restored_and_a_script_override_noted():
    before = torch.get_num_threads()
    applied = install_settings({"threads": 1}, say=lambda t: None)
    try:
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)  # the script's own call wins
        assert torch.get_num_threads() == 2
    finally:
        applied.uninstall()
    assert torch.get_num_threads() == before
    assert any("overrides threads=1" in n for n in applied.notes)


def test_cuda_flags_are_set_and_restored():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    applied = install_settings({"cuda.tf32": not before[0], "cuda.cudnn_benchmark": not before[2]},
                               say=lambda t: None)
    assert torch.backends.cuda.matmul.allow_tf32 is (not before[0])
    assert torch.backends.cudnn.allow_tf32 is (not before[0])
    assert torch.backends.cudnn.benchmark is (not before[2])
    applied.uninstall()
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.benchmark) == before


def test_notes_are_written(tmp_path):
    applied = install_settings({"threads": 1, "args.--workers": 4}, say=lambda t: None)
    applied.uninstall()
    applied.write_notes(tmp_path / "patches.json")
    data = json.loads((tmp_path / "patches.json").read_text())
    assert data["notes"] == applied.notes and any("set_num_threads(1)" in n for n in data["notes"])
