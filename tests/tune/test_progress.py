"""The tune's progress lines fold at the width of where they go (tune/progress.py), losing nothing."""

from __future__ import annotations

import io

from trainspeed.tune.progress import CONTINUATION, ProgressPrinter, fold

TRIAL_LENGTH = ("the first baseline trial took 16 s: 1.3 s to start, 16 steps of 225 ms-1.63 s (median 643 ms); "
                "each trial runs 2 warm-up + 10 measured steps (~8 s), cut to fit ~19 trials in the budget")
SAW = ("the baseline saw: training DataLoader at train.py:34 (num_workers=0); model Sequential called at "
       "train.py:40; SGD built at train.py:36 (and 1 more optimizer at train.py:37); 1 flags (--steps)")


def joined(parts: list[str]) -> str:
    return " ".join(part.strip() for part in parts)


def test_a_long_line_folds_at_words_within_the_width_and_reads_back_whole():
    for line in (TRIAL_LENGTH, SAW, "  " + SAW, "    failed: " + SAW):
        for width in (40, 60, 80, 110):
            parts = fold(line, width)
            assert all(len(p) <= width for p in parts), (width, parts)
            assert joined(parts) == line.strip()  # every word, every figure, in order
            indent = len(line) - len(line.lstrip())
            assert parts[0].startswith(line[:indent + 1])
            assert all(p.startswith(" " * (indent + CONTINUATION)) and not p[indent + CONTINUATION].isspace()
                       for p in parts[1:])


def test_a_clause_break_near_the_end_is_where_it_folds():
    parts = fold(TRIAL_LENGTH, 110)
    assert parts == ["the first baseline trial took 16 s: 1.3 s to start, 16 steps of 225 ms-1.63 s (median 643 ms);",
                     "    each trial runs 2 warm-up + 10 measured steps (~8 s), cut to fit ~19 trials in the budget"]


def test_a_short_line_and_a_word_longer_than_the_width_stay_whole():
    assert fold("  trial baseline (#1) ...", 110) == ["  trial baseline (#1) ..."]
    path = "/very/long/" + "x" * 80 + "/tune.jsonl"
    parts = fold(f"resuming: 3 finished trials in {path} (those of this command are reused)", 60)
    assert path in [p.strip() for p in parts]  # a path is never cut
    assert joined(parts) == f"resuming: 3 finished trials in {path} (those of this command are reused)"


def test_the_printer_folds_each_line_of_a_text_at_the_streams_width():
    out = io.StringIO()
    ProgressPrinter(stream=out, width=lambda stream: 60)(SAW + "\n  short")
    lines = out.getvalue().splitlines()
    assert lines[-1] == "  short" and all(len(line) <= 60 for line in lines)
    unfolded = io.StringIO()
    ProgressPrinter(stream=unfolded, width=lambda stream: None)(SAW)  # a terminal that cannot say: as it was
    assert unfolded.getvalue() == SAW + "\n"


def test_a_figure_and_its_unit_stay_on_one_line():
    line = "the first baseline trial took 2 s: 1.0 s to start, 5 steps of 175 ms-192 ms (median 184 ms)"
    for width in range(30, len(line)):
        parts = fold(line, width)
        assert joined(parts) == line
        assert not any(part.lstrip().startswith(("ms", "s ")) for part in parts[1:]), (width, parts)
