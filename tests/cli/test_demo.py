"""`make demo` end to end, short: the doctor names the planted cause, the tune writes its
table, the after run and the comparison exist, and the closing lines say what to do next."""

from __future__ import annotations

import json

import pytest

from trainspeed import demo

pytestmark = pytest.mark.timeout(300)


@pytest.mark.slow  # 10-40 s: started first under xdist (tests/conftest.py)
def test_demo_tells_the_story_on_its_slow_script(tmp_path, capsys):
    pytest.importorskip("PIL")
    out = tmp_path / "demo"
    from trainspeed.cli.tune import NOTHING_MEASURED

    rc = demo.main(["--steps", "12", "--budget", "12s", "--out", str(out)])
    text = capsys.readouterr().out
    # a budget this short may measure nothing on a loaded machine: the story goes on, and the
    # status says so (a tune that measured nothing is no verdict)
    assert rc == 0 or (rc == NOTHING_MEASURED == demo.NOTHING_MEASURED and "no setting could be measured" in text)
    before = json.loads((out / "before" / "report.json").read_text())
    assert before["findings"][0]["id"] == "data_bound"
    assert before["summary"]["steps"] == 12
    assert "python train.py" in before["findings"][0]["verify_with"]  # runnable from the demo folder
    # a baseline trial longer than the whole budget ends the tune before it writes its table
    # (BaselineOutOfBudget, exit 3): then only the after run is there
    assert (out / "tune" / "tune.json").is_file() or rc == NOTHING_MEASURED
    assert (out / "after" / "report.json").is_file()
    assert (out / "after" / "compare.html").is_file() or (out / "before" / "compare.html").is_file()
    assert (out / "train.py").read_bytes() == demo.SCRIPT.read_bytes()  # the demo's copy is never edited
    assert "now your own script:  trainspeed doctor -- python train.py ARGS" in text
    assert "Traceback" not in text
