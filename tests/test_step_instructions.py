"""benchmarks/step_instructions.py's pure parts (no valgrind needed): reading a callgrind dump's
totals, the cycle estimate, and the side's loop running to its counting window's end."""
from __future__ import annotations

import pytest
from benchmark_module import load_benchmark

pytestmark = pytest.mark.timeout(120)


def _tool():
    return load_benchmark("step_instructions")


DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
cmd:  python step_instructions.py --child hand --steps 45
part: 1
thread: 1
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw
fl=(1) ceval.c
fn=(1) _PyEval_EvalFrameDefault
0 900 300 100 20 10 5 2 1 1
summary: 9000 3000 1000 200 100 50 20 10 10
"""


def test_a_dump_is_read_by_its_event_names_and_a_dump_without_totals_is_an_error(tmp_path):
    tool = _tool()
    dump = tmp_path / "cg.hand.1-01"
    dump.write_text(DUMP)
    totals = tool.read_dump(dump)
    assert totals["Ir"] == 9000 and totals["I1mr"] == 200 and totals["DLmw"] == 10
    # L1 misses 350, of which 40 also missed L2: 9000 + 12 * 310 + 40 * 40
    assert tool.cycles({k: float(v) for k, v in totals.items()}) == 9000 + 12 * 310 + 40 * 40
    dump.write_text(DUMP.rsplit("summary:", 1)[0])
    with pytest.raises(RuntimeError, match="no totals line"):
        tool.read_dump(dump)


def test_a_side_runs_past_its_window_and_calls_both_markers(monkeypatch):
    """The markers that callgrind keys on (math.comb zeroes, math.perm dumps) are called once
    each, at the window's first and last step: a side that stopped early would dump nothing."""
    tool = _tool()
    import math

    calls = []
    monkeypatch.setattr(math, "comb", lambda *a: calls.append("comb"))
    monkeypatch.setattr(math, "perm", lambda *a: calls.append("perm"))
    monkeypatch.setattr(tool, "START", 3)
    monkeypatch.setattr(tool, "HIDDEN", 16)
    tool.child("null", 2)
    assert calls == ["comb", "perm"]
