"""The ZeRO knobs (zero_stage, overlap_comm, bucket_size): what they try from a DeepSpeed config,
why they skip, and one real short tune of a tiny gpt under distributed.strategy=deepspeed whose
ablation table holds them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainspeed.config import load_config
from trainspeed.engine.deepspeed_config import build_deepspeed_config
from trainspeed.errors import ConfigError
from trainspeed.tune.knobs import KNOBS, Candidate, DeviceInfo, KnobContext, Skip, parse_knobs
from trainspeed.tune import stats
from trainspeed.tune.search import apply_settings
from trainspeed.tune.zero import STAGE3_MEMORY_SHARE, bucket_label

ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = ROOT / ".cache" / "torch_extensions"
ZERO = ("zero_stage", "overlap_comm", "bucket_size")


def deepspeed(base: dict, **distributed) -> dict:
    settings = {"distributed.strategy": "deepspeed", "compile.mode": "off"}
    settings.update({f"distributed.{k}": v for k, v in distributed.items()})
    return apply_settings(base, settings)


def items(name: str, config: dict, device: DeviceInfo, **kw) -> list:
    return KNOBS[name](KnobContext(config=config, device=device, **kw))


def offered(name: str, config: dict, device: DeviceInfo, **kw) -> dict[str, dict]:
    return {c.label: c.settings for c in items(name, config, device, **kw) if isinstance(c, Candidate)}


def test_without_deepspeed_every_zero_knob_is_skipped_with_the_reason(base_config, cpu):
    for name in ZERO:
        [skip] = items(name, base_config, cpu)
        assert isinstance(skip, Skip) and skip.knob == name and not skip.deferred
        assert skip.reason.startswith("distributed.strategy is 'none'") and "deepspeed" in skip.reason
    ddp = apply_settings(base_config, {"distributed.strategy": "ddp"})
    assert "'ddp'" in items("zero_stage", ddp, cpu)[0].reason


def test_zero_stage_tries_the_other_stages_and_stage_3_only_under_memory_pressure(base_config, cpu):
    ds = deepspeed(base_config, zero_stage=2)
    assert offered("zero_stage", ds, cpu, baseline_memory=1e9) == {
        "0": {"distributed.zero_stage": 0}, "1": {"distributed.zero_stage": 1}}
    [three] = [s for s in items("zero_stage", ds, cpu, baseline_memory=1e9) if isinstance(s, Skip)]
    assert three.label == "3" and "peaked at 12%" in three.reason and ">= 50%" in three.reason
    # unknown peak (no baseline yet): not tried either, and the reason says so
    assert "peaked at unknown" in [s for s in items("zero_stage", ds, cpu) if isinstance(s, Skip)][0].reason
    # the baseline took over half of the device's memory: stage 3 is worth its trial
    heavy = STAGE3_MEMORY_SHARE * cpu.memory_bytes
    assert offered("zero_stage", ds, cpu, baseline_memory=heavy) == {
        "0": {"distributed.zero_stage": 0}, "1": {"distributed.zero_stage": 1}, "3": {"distributed.zero_stage": 3}}


def test_the_current_settings_come_from_the_deepspeed_json_and_the_overrides(base_config, cpu, tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1, "overlap_comm": True,
                                                      "reduce_bucket_size": 200_000_000}}))
    ds = deepspeed(base_config, deepspeed=str(path))
    assert set(offered("zero_stage", ds, cpu, baseline_memory=1e9)) == {"0", "2"}
    assert offered("overlap_comm", ds, cpu) == {"false": {"distributed.overlap_comm": False}}
    assert offered("bucket_size", ds, cpu) == {"5e7": {"distributed.bucket_size": 50_000_000},
                                               "5e8": {"distributed.bucket_size": 500_000_000}}
    # distributed.* override the JSON (what the engine hands DeepSpeed)
    over = deepspeed(base_config, deepspeed=str(path), zero_stage=2, overlap_comm=False, bucket_size=50_000_000)
    assert set(offered("zero_stage", over, cpu, baseline_memory=1e9)) == {"0", "1"}
    assert offered("overlap_comm", over, cpu) == {"true": {"distributed.overlap_comm": True}}
    assert set(offered("bucket_size", over, cpu)) == {"2e8", "5e8"}
    # an inline mapping reads the same
    inline = deepspeed(base_config, deepspeed={"zero_optimization": {"stage": 1}})
    assert set(offered("zero_stage", inline, cpu, baseline_memory=1e9)) == {"0", "2"}


def test_deepspeed_defaults_fill_what_the_config_leaves_out(base_config, cpu):
    """Unset: buckets of 5e8 elements, overlap_comm on at stage 3 only (DeepSpeed's rules)."""
    two = deepspeed(base_config, zero_stage=2)
    assert set(offered("bucket_size", two, cpu)) == {"5e7", "2e8"}
    assert offered("overlap_comm", two, cpu) == {"true": {"distributed.overlap_comm": True}}
    three = deepspeed(base_config, zero_stage=3)
    assert offered("overlap_comm", three, cpu) == {"false": {"distributed.overlap_comm": False}}


def test_overlap_and_buckets_wait_for_a_zero_stage(base_config, cpu):
    """Stage 0 has no ZeRO reduction: overlap_comm and bucket_size are deferred and tried on top
    of a zero_stage winner >= 1 (the greedy step asks the knob again on that config)."""
    plain = deepspeed(base_config)  # no JSON, no zero_stage: stage 0
    assert set(offered("zero_stage", plain, cpu, baseline_memory=1e9)) == {"1", "2"}
    for name in ("overlap_comm", "bucket_size"):
        [skip] = items(name, plain, cpu)
        assert isinstance(skip, Skip) and skip.deferred and "zero_stage winner >= 1" in skip.reason
        assert offered(name, apply_settings(plain, {"distributed.zero_stage": 1}), cpu)


def test_every_zero_candidate_is_a_config_the_engine_builds(base_config, cpu):
    ds = deepspeed(base_config, zero_stage=2)
    for name in ZERO:
        for item in items(name, ds, cpu, baseline_memory=cpu.memory_bytes):
            if isinstance(item, Candidate):
                cfg = load_config(apply_settings(ds, item.settings))
                zero = build_deepspeed_config(cfg, world_size=1)["zero_optimization"]
                key, value = next(iter(item.settings.items()))
                expected = {"distributed.zero_stage": ("stage",), "distributed.overlap_comm": ("overlap_comm",),
                            "distributed.bucket_size": ("reduce_bucket_size", "allgather_bucket_size")}[key]
                assert all(zero[k] == value for k in expected), (item, zero)


def test_knobs_deepspeed_refuses_are_skipped_not_failed(base_config, cpu, tmp_path):
    """compile (the engine refuses it under DeepSpeed), and a batch the DeepSpeed JSON fixes:
    a trial would end in a ConfigError, so the knob says why instead."""
    ds = deepspeed(base_config, zero_stage=2)
    [skip] = items("compile", ds, cpu)
    assert isinstance(skip, Skip) and "compile.mode=off" in skip.reason
    assert offered("batch_size", ds, cpu) and offered("grad_accumulation", ds, cpu)  # the JSON fixes nothing
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": "auto"}))
    pinned = deepspeed(base_config, deepspeed=str(path))
    for name in ("batch_size", "grad_accumulation"):
        [skip] = items(name, pinned, cpu)
        assert isinstance(skip, Skip) and "train_micro_batch_size_per_gpu=16" in skip.reason


def test_zero_knob_names_parse_for_a_config_tune():
    assert parse_knobs("zero_stage, overlap_comm,bucket_size") == list(ZERO)
    assert set(ZERO) <= set(parse_knobs(None))
    with pytest.raises(ConfigError, match="did you mean 'zero_stage'"):
        parse_knobs("zero_stag")


def test_bucket_labels():
    assert [bucket_label(n) for n in (50_000_000, 200_000_000, 500_000_000, 150_000_000, 1_000_000_000)] == [
        "5e7", "2e8", "5e8", "1.5e8", "1e9"]


def test_deepspeed_trials_on_the_cpu_preload_deepspeed_in_the_fork_server(monkeypatch):
    from trainspeed.tune.session import DEEPSPEED_MODULES, deepspeed_preload

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    cpu = DeviceInfo(type="cpu", cores=2)
    plain = load_config({"recipe": {"name": "gpt"}})
    assert deepspeed_preload(plain, cpu) == () and "DS_ACCELERATOR" not in os.environ
    ds = load_config({"recipe": {"name": "gpt"}, "distributed": {"strategy": "deepspeed"}})
    assert deepspeed_preload(ds, DeviceInfo(type="cuda", cores=8)) == ()
    assert deepspeed_preload(ds, cpu) == DEEPSPEED_MODULES and os.environ["DS_ACCELERATOR"] == "cpu"


# ------------------------------------------------------------------ an unchanged DeepSpeed script

ENGINE = {"class": "DeepSpeedEngine", "zero_stage": 2, "overlap_comm": True}
"""The doctor's "deepspeed" observation of the baseline (what the knobs need: that there is one)."""


def ds_file(tmp_path: Path, zero: dict | None = None) -> tuple[Path, dict]:
    path = tmp_path / "ds_config.json"
    config = {"train_micro_batch_size_per_gpu": 8, "bf16": {"enabled": True},
              "zero_optimization": zero if zero is not None else {"stage": 2, "overlap_comm": True}}
    path.write_text(json.dumps(config, indent=1))
    return path, config


def script_ctx(tmp_path: Path, zero: dict | None = None, *, engine: dict | None = ENGINE, flag: str = "--deepspeed_config",
               settings: dict | None = None, baseline_memory: float | None = 1e9):
    from trainspeed.patches.targets import Targets
    from trainspeed.tune.script_facts import ScriptFacts, deepspeed_config_file
    from trainspeed.tune.script_knobs import ScriptContext

    path, _ = ds_file(tmp_path, zero)
    flags = [{"option": flag, "dest": flag.lstrip("-"), "value": path.name, "type": "str", "kind": "store"}]
    facts = ScriptFacts(targets=Targets(model_class="DeepSpeedEngine"), deepspeed=engine,
                        deepspeed_config=deepspeed_config_file(flags, cwd=tmp_path))
    return ScriptContext(facts=facts, device=DeviceInfo(type="cpu", cores=2, memory_bytes=8e9),
                         settings=settings or {}, baseline_memory=baseline_memory)


def script_offered(name: str, ctx) -> dict[str, dict]:
    from trainspeed.tune.script_knobs import SCRIPT_KNOBS

    return {c.label: c.settings for c in SCRIPT_KNOBS[name](ctx) if isinstance(c, Candidate)}


def test_the_script_flag_that_names_the_deepspeed_json_is_found_and_read(tmp_path):
    from trainspeed.tune.script_facts import deepspeed_config_file

    path, config = ds_file(tmp_path)
    switch = {"option": "--deepspeed", "dest": "deepspeed", "value": True, "kind": "storetrue"}
    ds_flag = {"option": "--deepspeed_config", "dest": "deepspeed_config", "value": "ds_config.json", "kind": "store"}
    found = deepspeed_config_file([switch, ds_flag], cwd=tmp_path)
    assert (found.option, found.path, found.config, found.error) == ("--deepspeed_config", str(path), config, None)
    # Hugging Face's TrainingArguments: --deepspeed takes the path
    hf = deepspeed_config_file([{"option": "--deepspeed", "dest": "deepspeed", "value": str(path)}])
    assert hf.option == "--deepspeed" and hf.config == config
    assert deepspeed_config_file([switch]) is None  # a bare switch names no file
    (tmp_path / "bad.json").write_text("{not json")
    bad = deepspeed_config_file([dict(ds_flag, value="bad.json")], cwd=tmp_path)
    assert bad.config == {} and "not a readable JSON file" in bad.error


def test_script_zero_knobs_edit_the_deepspeed_json(tmp_path):
    ctx = script_ctx(tmp_path)
    assert script_offered("zero_stage", ctx) == {"0": {"ds_config.zero_optimization.stage": 0},
                                                 "1": {"ds_config.zero_optimization.stage": 1}}
    assert "3" in script_offered("zero_stage", script_ctx(tmp_path, baseline_memory=6e9))
    assert script_offered("overlap_comm", ctx) == {"false": {"ds_config.zero_optimization.overlap_comm": False}}
    assert script_offered("bucket_size", ctx)["5e7"] == {"ds_config.zero_optimization.reduce_bucket_size": 50_000_000,
                                                         "ds_config.zero_optimization.allgather_bucket_size": 50_000_000}
    assert set(script_offered("bucket_size", ctx)) == {"5e7", "2e8"}
    # stage 0 in the JSON: overlap and buckets wait for a zero_stage winner, then are offered on top
    plain = script_ctx(tmp_path, {"stage": 0})
    from trainspeed.tune.script_knobs import SCRIPT_KNOBS

    [skip] = SCRIPT_KNOBS["bucket_size"](plain)
    assert isinstance(skip, Skip) and skip.deferred
    on_top = script_ctx(tmp_path, {"stage": 0}, settings={"ds_config.zero_optimization.stage": 1})
    assert set(script_offered("bucket_size", on_top)) == {"5e7", "2e8"}
    assert script_offered("overlap_comm", on_top) == {"true": {"ds_config.zero_optimization.overlap_comm": True}}


def test_script_zero_knobs_say_why_they_cannot_apply(tmp_path):
    from trainspeed.tune.script_knobs import SCRIPT_KNOBS, parse_script_knobs

    no_engine = script_ctx(tmp_path, engine=None)
    no_flag = script_ctx(tmp_path, flag="--config")  # a flag the knobs do not know names no DeepSpeed JSON
    for name in ZERO:
        [skip] = SCRIPT_KNOBS[name](no_engine)
        assert isinstance(skip, Skip) and "runs no DeepSpeed engine" in skip.reason
        [skip] = SCRIPT_KNOBS[name](no_flag)
        assert isinstance(skip, Skip) and "--deepspeed_config" in skip.reason and "copy of that file" in skip.reason
    assert parse_script_knobs("zero_stage,overlap_comm,bucket_size") == list(ZERO)


def test_a_trial_runs_an_edited_copy_and_the_users_json_is_only_read(tmp_path):
    from trainspeed.patches.plan import apply_flags, load_plan
    from trainspeed.tune.script_trials import ScriptRunner, write_ds_config
    from trainspeed.tune.trials import TrialRequest, overrides_of

    ctx = script_ctx(tmp_path)
    user = tmp_path / "ds_config.json"
    before = user.read_bytes()
    command = ["python", "train.py", "--deepspeed_config", "ds_config.json", "--epochs", "1"]
    runner = ScriptRunner(base_config=tmp_path / "x.yaml", out_dir=tmp_path / "trials", command=command,
                          deepspeed_config=ctx.facts.deepspeed_config)
    settings = {"ds_config.zero_optimization.stage": 1, "ds_config.zero_optimization.reduce_bucket_size": 50_000_000,
                "threads": 1}
    args = runner.arguments(TrialRequest(key="k", label="x", overrides=overrides_of(settings), repeat=0))
    plan = load_plan(args[args.index("--with") + 1])
    copy = tmp_path / "trials" / ".plans" / "k.deepspeed.json"
    assert plan.settings == {"threads": 1, "args.--deepspeed_config": str(copy)}
    assert apply_flags(command, plan.flags()) == ["python", "train.py", "--deepspeed_config", str(copy),
                                                  "--epochs", "1"]
    edited = json.loads(copy.read_text())
    assert edited["zero_optimization"] == {"stage": 1, "overlap_comm": True, "reduce_bucket_size": 50_000_000}
    assert edited["bf16"] == {"enabled": True} and edited["train_micro_batch_size_per_gpu"] == 8  # the rest kept
    assert user.read_bytes() == before
    assert write_ds_config({"threads": 1}, None, copy) == {"threads": 1}  # nothing to edit: as given
    with pytest.raises(ConfigError, match="no flag of the script names one"):
        write_ds_config({"ds_config.zero_optimization.stage": 1}, None, copy)


def test_a_zero_winner_comes_back_as_a_tuned_json_and_the_flag_to_pass(tmp_path, monkeypatch):
    from trainspeed.patches.plan import load_plan
    from trainspeed.tune.result import Row, TuneResult
    from trainspeed.tune.script_session import write_script_outputs

    ctx = script_ctx(tmp_path)
    monkeypatch.chdir(tmp_path)
    best = {"ds_config.zero_optimization.stage": 1}
    result = TuneResult(ablation=[Row(knob="zero_stage", setting="1", settings=best, verdict="faster", speedup=1.2)],
                        combination=[], best_settings=best, final=None, baseline_cost_s=1e-3, trials_run=3,
                        trials_reused=0, elapsed_s=10.0)
    command = ["python", "train.py", "--deepspeed_config", "ds_config.json"]
    out = tmp_path / "out"
    out.mkdir()
    write_script_outputs(command, result, out, ctx.facts, runner=None)
    tuned = out / "deepspeed_config.json"
    assert json.loads(tuned.read_text())["zero_optimization"] == {"stage": 1, "overlap_comm": True}
    assert load_plan(out / "best.yaml").settings == {"args.--deepspeed_config": str(tuned)}
    data = json.loads((out / "tune.json").read_text())
    assert data["tuned_command"] == ["python", "train.py", "--deepspeed_config", str(tuned)]
    assert data["best_settings"] == best
    assert json.loads((tmp_path / "ds_config.json").read_text())["zero_optimization"]["stage"] == 2


# ------------------------------------------------------------------ a real short tune

TINY = ["recipe.options.size=null", "recipe.options.n_layer=1", "recipe.options.n_head=2",
        "recipe.options.n_embd=32", "recipe.options.block_size=32", "data.batch_size=4",
        "recipe.options.samples_per_epoch=256", "recipe.options.val_samples=16", "recipe.options.dropout=0.0",
        "precision.mode=fp32", "compile.mode=off", "run.torch_threads=1", "distributed.strategy=deepspeed",
        "distributed.zero_stage=2"]


def ds_env() -> dict[str, str]:
    """DeepSpeed on the CPU, its op from the repository's build cache, the venv's ninja first
    (another ninja version rebuilds the op: a minute on 2 cores)."""
    return {**os.environ, "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": str(EXTENSIONS),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}


@pytest.fixture(scope="module")
def deepspeed_op():
    """DeepSpeed's CPU op, built once into the repository's cache (`make venv` builds it); a
    machine where it cannot build skips the test."""
    pytest.importorskip("deepspeed")
    if list((EXTENSIONS / "deepspeed_shm_comm").glob("*.so")):
        return  # built: the trials load it (~15 s saved on 2 cores)
    build = subprocess.run([sys.executable, "-c", "from deepspeed.comm.torch import build_shm_op; build_shm_op()"],
                           env=ds_env(), capture_output=True, text=True, timeout=600)
    if build.returncode:
        pytest.skip(f"DeepSpeed's CPU op does not build here: {build.stderr.strip().splitlines()[-1:]}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_real_tune_of_a_deepspeed_config_measures_the_zero_knobs(deepspeed_op, tmp_path):
    out = tmp_path / "tune"
    cmd = [sys.executable, "-m", "trainspeed", "tune", "gpt", *TINY, "--knobs", ",".join(ZERO),
           "--out", str(out), "--steps", "4", "--warmup-steps", "1", "--repeats", "1", "--baseline-every", "5",
           "--verify-repeats", "0", "--max-rounds", "1", "--budget", "5m"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=ds_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "tune.json").read_text())
    rows = {(r["knob"], r["setting"]): r for r in data["ablation"]}
    assert set(rows) == {("zero_stage", "0"), ("zero_stage", "1"), ("zero_stage", "3"), ("overlap_comm", "true"),
                         ("bucket_size", "5e7"), ("bucket_size", "2e8")}, list(rows)
    assert rows["zero_stage", "3"]["verdict"] == "skipped" and "ZeRO-3" in rows["zero_stage", "3"]["note"]
    measured = [r for key, r in rows.items() if key != ("zero_stage", "3")]
    for row in measured:
        # every setting ran; fp32 on one rank: ZeRO's stage, overlap and buckets change no arithmetic.
        # Measured, whatever the machine's load: a verdict, or the tune's "not measurable while
        # the machine is busy" (its trials saw different loads), which a loaded machine gives
        assert row["verdict"] in ("faster", "slower", "no measurable change", stats.BUSY), row
        assert row["speedup"] > 0 and abs(row["loss_delta"]) < 1e-4, row
    # each trial ran what its row says: DeepSpeed's own description of the engine it started
    trials = [json.loads(line) for line in (out / "tune.jsonl").read_text().splitlines()]
    said = {t["label"]: _deepspeed_note(Path(t["run_dir"])) for t in trials if t["repeat"] == 0}
    assert said["baseline"].startswith("DeepSpeed ZeRO stage 2, fp32, 1 rank(s)")
    assert said["zero_stage=0"].startswith("DeepSpeed ZeRO stage 0") and said["zero_stage=1"].startswith(
        "DeepSpeed ZeRO stage 1")
    assert "overlap_comm=True" in said["overlap_comm=true"]
    assert "| zero_stage | 0 |" in (out / "tune.md").read_text()
    best = load_config(out / "best.yaml")  # a config `trainspeed train` loads, the winners applied
    assert best.distributed.strategy == "deepspeed"
    for key, value in data["best_settings"].items():
        assert getattr(best.distributed, key.split(".")[1]) == value


def _deepspeed_note(run_dir: Path) -> str:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return next(e["data"]["message"] for e in events
                if e["type"] == "note" and e["data"]["message"].startswith("DeepSpeed ZeRO"))


# The real script tune of zero_stage (each trial runs its stage through an edited copy of the
# JSON; the user's file is only read) is tests/doctor/test_deepspeed_script.py's: the doctor's ZeRO-3
# finding runs its verify command, that same tune, and checks it so; a second one here cost ~25 s of CPU.
