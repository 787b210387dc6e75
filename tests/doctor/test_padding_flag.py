"""Padding advice that speaks to the script: Hugging Face's --pad_to_max_length switch (as in
transformers' run_glue_no_trainer.py, which read 69 % padding and was told to write a collate_fn
it already has) and what padding per batch would really remove, measured from the masks."""
from __future__ import annotations

import pytest
import torch

from trainspeed.doctor.checks.bound import where_time_goes
from trainspeed.doctor.checks.context import CheckContext
from trainspeed.doctor.checks.script_flags import padding_flag
from trainspeed.doctor.instrument.batch import batch_stats
from trainspeed.telemetry.rundir import read_run
from trainspeed.telemetry.summary import summarize

pytestmark = pytest.mark.timeout(120)

STORE_TRUE_ON = {"option": "--pad_to_max_length", "dest": "pad_to_max_length", "kind": "storetrue", "value": True}
GROUP_OFF = {"option": "--group_by_length", "dest": "group_by_length", "kind": "store", "type": "string_to_bool",
             "bare_value": True, "value": False}


def test_the_padding_past_each_batchs_longest_sample_is_measured_from_the_mask_and_the_pad_id():
    mask = torch.zeros(3, 10, dtype=torch.long)
    for row, n in enumerate((2, 7, 4)):
        mask[row, :n] = 1
    stats = batch_stats({"input_ids": mask * 5, "attention_mask": mask})
    assert stats.pad_tokens == 30 - 13 and stats.beyond_longest == 3 * (10 - 7)
    ids = torch.tensor([[4, 4, 0, 0, 0, 0], [3, 3, 3, 3, 0, 0], [5, 0, 0, 0, 0, 0]])
    stats = batch_stats([ids])
    assert stats.pad_source == "pad_id=0" and stats.pad_tokens == 11 and stats.beyond_longest == 3 * 2


def test_the_rule_picks_the_switch_that_pads_less():
    assert padding_flag([STORE_TRUE_ON], already_dynamic=False) == (STORE_TRUE_ON, False)
    assert padding_flag([{**STORE_TRUE_ON, "value": False}], already_dynamic=True) is None
    # padded per batch already: the grouping switch of TrainingArguments is what is left
    assert padding_flag([{**STORE_TRUE_ON, "value": False}, GROUP_OFF], already_dynamic=True) == (GROUP_OFF, True)
    assert padding_flag([GROUP_OFF], already_dynamic=False) == (GROUP_OFF, True)
    assert padding_flag([{**GROUP_OFF, "value": True}], already_dynamic=True) is None
    # a value flag the tune could not set on and off is not named (the finding keeps the code advice)
    assert padding_flag([{**STORE_TRUE_ON, "kind": "store", "type": "<lambda>"}], already_dynamic=False) is None


def test_a_scripts_pad_to_max_length_is_named_with_what_each_fix_removes(doctor):
    result = doctor("hf_style_padding.py", "--pad_to_max_length", steps=25)
    first = result.findings[0]
    assert first["id"] == "padding_waste", result.findings
    assert "read from attention_mask" in first["evidence"]
    assert "the script's flag: --pad_to_max_length (on)" in first["evidence"]
    # lengths 8-120 padded to 128 in batches of 16: the batch's longest sample is near 120, so
    # padding per batch removes a few percent and the spread inside the batch is most of it
    run = read_run(result.run_dir)
    ctx = CheckContext.from_run(run, summarize(run))
    batch = ctx.first("batch")
    beyond = batch["beyond_longest"] / batch["measured_tokens"]
    inside = (batch["measured_pad"] - batch["beyond_longest"]) / batch["measured_tokens"]
    assert 0.0 < beyond < 0.12 and 0.35 < inside < 0.6
    assert f"removes {beyond:.0%} of the positions, batching similar lengths together the other {inside:.0%}" \
        in first["evidence"]
    assert first["recommendation"].startswith("leave out --pad_to_max_length (each batch padded to its own longest")
    assert "length-bucketed batch sampler" in first["recommendation"]
    assert "collate_fn" not in first["recommendation"]
    assert first["verify_with"].startswith("trainspeed tune --knobs padding -- python ")
    assert first["verify_with"].endswith("hf_style_padding.py --pad_to_max_length")
    # the tune's "at stake" for the knob is what the flag can remove, not the whole finding's
    from trainspeed.tune.stakes import stakes_by_knob

    assert first["verify_impact"] < first["impact"] / 3
    assert stakes_by_knob([first])["padding"] == pytest.approx(first["verify_impact"])
    # the report's first statement offers less padding first and measures it with the same knob
    goes = where_time_goes(ctx)
    assert goes["helps"][0].startswith("less padding (")
    assert goes["verify_with"].startswith("trainspeed tune --knobs padding,precision,compile,fused_optimizer -- ")


def test_without_the_switch_the_batches_are_per_batch_and_grouping_is_the_advice(doctor):
    result = doctor("hf_style_padding.py", steps=25)
    found = {f["id"]: f for f in result.findings}
    assert "padding_waste" in found, result.findings
    f = found["padding_waste"]
    assert "already padded to their own longest sequence" in f["evidence"]
    assert "the script's flag" not in f["evidence"] and "length-bucketed batch sampler" in f["recommendation"]
    assert f["verify_with"].startswith("trainspeed doctor --steps 25 -- ")  # no flag: a code change, re-checked
