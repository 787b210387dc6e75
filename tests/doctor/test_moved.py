"""moved.py tells a manual update from none without reading a value (issue 32): on the meta
device, whose tensors have no values to read, as a CUDA tensor's cannot be read without a
sync. The doctor read a few CPU values before, so `p.data.add_(...)` on a GPU closed no step."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from trainspeed.doctor.instrument import moved
from trainspeed.patches.machinery import Patches

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def watched():
    patches = Patches()
    moved.install(None, patches)
    try:
        yield
    finally:
        patches.undo()


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_an_update_through_data_is_seen_without_reading_a_value(watched, device):
    model = nn.Linear(8, 4, device=device)
    mark = moved.mark_params(model)
    model.weight.data.sum()  # a read through .data is no update
    assert not moved.params_moved(model, mark)
    for p in model.parameters():
        p.data.add_(torch.ones_like(p), alpha=-0.01)  # word_language_model's update
    assert moved.params_moved(model, mark)
    assert not moved.params_moved(model, moved.mark_params(model))  # a new mark starts from here


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("how", ["no_grad", "kept_data", "assign_data"])
def test_other_manual_updates_are_seen(watched, device, how):
    model = nn.Linear(8, 4, device=device)
    moved.mark_params(model)  # the first backward
    kept = model.weight.data  # a tensor the script holds across steps
    mark = moved.mark_params(model)
    if how == "no_grad":
        with torch.no_grad():
            model.weight -= 0.01
    elif how == "kept_data":
        kept.mul_(0.5)
    else:
        model.weight.data = torch.zeros(4, 8, device=device)
    assert moved.params_moved(model, mark)


def test_the_patch_is_undone():
    patches = Patches()
    moved.install(None, patches)
    assert "data" in nn.Parameter.__dict__
    patches.undo()
    assert "data" not in nn.Parameter.__dict__ and not moved._WATCHED
    p = nn.Parameter(torch.zeros(2))
    p.data.add_(1.0)
    assert p.sum().item() == 2.0
