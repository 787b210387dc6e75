"""A config's device string read one way wherever the device is needed before one is built."""
from __future__ import annotations

import pytest
import torch

from trainspeed.device_spec import cuda_index

pytestmark = pytest.mark.timeout(30)


def test_the_cuda_index_a_device_string_names(monkeypatch):
    assert [cuda_index(s) for s in ("cpu", "mps", "cuda", "cuda:3")] == [None, None, 0, 3]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cuda_index("auto") == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_index("auto") is None
    assert cuda_index("cuda:1") == 1  # taken at its word: the caller that needs the device checks
