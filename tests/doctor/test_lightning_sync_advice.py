"""The advice for Lightning's reads in `convert_tensors_to_scalars` (fabric/utilities/apply_func.py
`value.item()`) names prog_bar only where the script logs with prog_bar=True. Lightning's
bug_report_model logs `self.log("train_loss", loss)` (prog_bar False); its reads came from the
logger connector writing the logs, and it was told to 'set prog_bar=False', which it had."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainspeed.doctor.checks import CheckContext
from trainspeed.doctor.checks.syncs import _fix
from trainspeed.telemetry.rundir import RunData
from trainspeed.telemetry.schema import make_event
from trainspeed.telemetry.summary import summarize

pytestmark = pytest.mark.timeout(60)


def _advice(tmp_path, log_call: str) -> str:
    pytest.importorskip("lightning")
    from lightning.fabric.utilities import apply_func

    lines = Path(apply_func.__file__).read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.strip() == "return value.item()")
    row = {"category": "sync", "kind": "item", "site": f"{apply_func.__file__}:{line}",
           "site_path": [apply_func.__file__, line], "code": "return value.item()", "count": 40,
           "library": "lightning"}
    script = tmp_path / "model.py"
    script.write_text("class M:\n    def training_step(self, batch, i):\n        loss = self(batch).sum()\n"
                      f"        {log_call}\n        return loss\n")
    model = {"kind": "model", "class": "M", "params": 66, "call_site_path": [str(script), 3]}
    run = RunData(path=Path("."), steps=[{"schema": 1, "step": 1, "t_step": 0.1, "phases": {}}],
                  events=[make_event("observation", 0, 0.0, **model)])
    return _fix(row, CheckContext.from_run(run, summarize(run)))


def test_no_prog_bar_advice_for_a_script_that_logs_without_it(tmp_path):
    text = _advice(tmp_path, 'self.log("train_loss", loss)')
    assert "prog_bar=False" not in text and "prog_bar=True" in text  # says when the bar reads, not that it did
    assert "Trainer(log_every_n_steps=" in text and "when it writes the logs" in text


def test_prog_bar_advice_names_the_scripts_own_call(tmp_path):
    text = _advice(tmp_path, 'self.log("train_loss", loss, prog_bar=True)')
    assert "set prog_bar=False in the `self.log(...)` of values logged every step" in text
    assert text.endswith("for the progress bar; yours: model.py:4)")
