from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from ckpt_helpers import tiny_model

from trainspeed.engine.checkpoint.atomic import atomic_save, load_verified
from trainspeed.engine.checkpoint.state import (
    TrainState,
    build_checkpoint,
    capture_rng,
    load_model_state,
    model_state_dict,
    restore_checkpoint,
    restore_rng,
)
from trainspeed.errors import CheckpointError

pytestmark = pytest.mark.timeout(60)


def _draw() -> tuple:
    return (
        [random.random() for _ in range(3)],
        random.gauss(0, 1),
        np.random.rand(3).tolist(),
        float(np.random.standard_normal()),
        torch.rand(3).tolist(),
        torch.randint(0, 1000, (4,)).tolist(),
    )


def test_rng_capture_restore_reproduces_streams(tmp_path):
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    _draw()  # move away from the seeded start, and leave a cached gaussian behind
    state = capture_rng()
    # Survives a weights_only round trip through a real file.
    atomic_save(state, tmp_path / "rng.pt")
    state = load_verified(tmp_path / "rng.pt")
    first = _draw()
    second = _draw()
    assert first != second  # the streams really advance
    restore_rng(state)
    assert _draw() == first


def test_restore_rng_rejects_garbage():
    with pytest.raises(CheckpointError, match="RNG state is malformed"):
        restore_rng({"python": [3]})


def _train(model, opt, sched, steps: int, seed: int) -> list[float]:
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(5, 4, generator=gen)
        noise = torch.randn(5, 2)  # from the global RNG: checks that RNG is restored too
        loss = ((model(x) - noise) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def _objects():
    model = tiny_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched


def test_build_restore_continues_exactly(tmp_path):
    torch.manual_seed(0)
    model, opt, sched = _objects()
    _train(model, opt, sched, 3, seed=1)
    ckpt = build_checkpoint(model, opt, sched, None, TrainState(step=3, samples=15),
                            {"epoch": 0, "batch_in_epoch": 3}, {"lr": 1e-2, "tuple": (1, 2)},
                            {"note": "x"})
    atomic_save(ckpt, tmp_path / "c.pt")
    reference = _train(model, opt, sched, 3, seed=2)

    torch.manual_seed(123)  # a different global RNG: restore must put it back
    model2, opt2, sched2 = _objects()
    loaded = load_verified(tmp_path / "c.pt")
    counters = restore_checkpoint(loaded, model2, opt2, sched2)
    assert counters == TrainState(step=3, samples=15)
    assert loaded["sampler"] == {"epoch": 0, "batch_in_epoch": 3}
    assert loaded["config"] == {"lr": 1e-2, "tuple": [1, 2]}
    assert loaded["config_hash"] and len(loaded["config_hash"]) == 16
    assert loaded["versions"]["torch"] == str(torch.__version__)
    assert _train(model2, opt2, sched2, 3, seed=2) == reference


def test_config_digest_override():
    model, opt, sched = _objects()
    ckpt = build_checkpoint(model, config_dict={"a": 1}, config_digest="abc")
    assert ckpt["config_hash"] == "abc" and ckpt["optimizer"] is None


def test_wrong_model_names_keys_and_shapes():
    ckpt = build_checkpoint(tiny_model(8))
    other = torch.nn.Sequential(torch.nn.Linear(4, 9), torch.nn.ReLU(), torch.nn.Linear(9, 2),
                                torch.nn.Linear(2, 2))
    with pytest.raises(CheckpointError) as info:
        restore_checkpoint(ckpt, other)
    msg = str(info.value)
    assert "missing in checkpoint (2): 3.bias, 3.weight" in msg
    assert "0.weight: checkpoint (8, 4) vs model (9, 4)" in msg
    smaller = torch.nn.Sequential(torch.nn.Linear(4, 8))
    with pytest.raises(CheckpointError, match=r"unexpected in checkpoint \(2\): 2.bias, 2.weight"):
        restore_checkpoint(ckpt, smaller)


def test_optimizer_mismatch_is_clear_and_leaves_model_untouched():
    model, opt, sched = _objects()
    _train(model, opt, sched, 1, seed=0)
    ckpt = build_checkpoint(model, opt, sched)
    fresh = tiny_model(8)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    params = list(fresh.parameters())
    two_groups = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:]}])
    with pytest.raises(CheckpointError, match=r"optimizer has 2 param group\(s\) with sizes \[2, 2\].*1 with sizes \[4\]"):
        restore_checkpoint(ckpt, fresh, two_groups)
    assert all(float(p.detach().abs().sum()) == 0.0 for p in fresh.parameters())
    sched2 = torch.optim.lr_scheduler.StepLR(two_groups, step_size=2)
    with pytest.raises(CheckpointError, match=r"scheduler does not fit.*2 param group\(s\).*drove 1"):
        restore_checkpoint(ckpt, fresh, None, sched2)
    no_opt = build_checkpoint(model)
    with pytest.raises(CheckpointError, match="no optimizer state"):
        restore_checkpoint(no_opt, fresh, torch.optim.AdamW(fresh.parameters()))


def test_not_a_checkpoint():
    with pytest.raises(CheckpointError, match="not a trainspeed checkpoint.*load_model_state"):
        restore_checkpoint(tiny_model().state_dict(), tiny_model())


def test_compiled_and_ddp_style_wrappers_are_transparent():
    src = tiny_model()
    compiled = torch.compile(src)  # wrapping only; nothing is compiled until it is called
    assert any(k.startswith("_orig_mod.") for k in compiled.state_dict())
    sd = model_state_dict(compiled)
    assert set(sd) == set(src.state_dict())

    # Checkpoint written by a DDP-wrapped model (module. prefix) into a compiled one.
    dst = tiny_model(8)
    with torch.no_grad():
        for p in dst.parameters():
            p.zero_()
    load_model_state(torch.compile(dst), {f"module.{k}": v for k, v in src.state_dict().items()})
    for a, b in zip(src.parameters(), dst.parameters()):
        assert torch.equal(a, b)

    # DataParallel wrapper (works on CPU) and a compiled submodule (`_orig_mod` mid-key).
    holder = torch.nn.Module()
    holder.block = torch.compile(tiny_model())
    assert "block._orig_mod.0.weight" in holder.state_dict()
    ckpt = build_checkpoint(torch.nn.DataParallel(holder))
    assert "block.0.weight" in ckpt["model"]
    plain = torch.nn.Module()
    plain.block = tiny_model()
    restore_checkpoint(ckpt, plain)


def test_scaler_roundtrip_and_disabled_scaler():
    model, opt, sched = _objects()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    ckpt = build_checkpoint(model, opt, None, scaler)
    other = torch.amp.GradScaler("cpu", init_scale=2.0)
    restore_checkpoint(ckpt, tiny_model(), torch.optim.AdamW(tiny_model().parameters()), None, other)
    assert other.get_scale() == 1024.0
    disabled = build_checkpoint(model, scaler=torch.amp.GradScaler("cpu", enabled=False))
    restore_checkpoint(disabled, tiny_model(), scaler=torch.amp.GradScaler("cpu", enabled=False))
    with pytest.raises(CheckpointError, match="no GradScaler state"):
        restore_checkpoint(build_checkpoint(model), tiny_model(), scaler=other)


def test_train_state_validation():
    assert TrainState.from_dict({"step": 4, "unknown": 1}).step == 4
    with pytest.raises(CheckpointError, match="TrainState.step must be an int >= 0"):
        TrainState(step=-1)
