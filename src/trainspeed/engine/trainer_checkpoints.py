"""The Trainer's checkpoints: its CheckpointSession (resume, then periodic, signal, crash and
final saves) and the function that builds the state each save writes. Plain functions over a
Trainer, kept out of trainer.py so that the loop there reads on its own."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable

from trainspeed.config import config_to_dict
from trainspeed.engine.checkpoint.session import CheckpointSession
from trainspeed.engine.events import Event, TrainerState

if TYPE_CHECKING:
    from trainspeed.engine.checkpoint.restore import ResumeTarget
    from trainspeed.engine.run_folders import NewFolders
    from trainspeed.engine.trainer_view import TrainerView


def _with_info(state: TrainerState, info: dict[str, Any]) -> TrainerState:
    state.info = dict(info)
    return state


def check_resume(cfg: Any) -> ResumeTarget | None:
    """The checkpoint a local checkpoint.resume names, found and verified before anything is
    built or written: a resume that cannot start leaves no run folder (restore.py)."""
    from trainspeed.engine.checkpoint.restore import check_resume_spec

    return check_resume_spec(cfg.checkpoint.resume)


def checkpoint_session(trainer: TrainerView, mon: Any, loaders: Any,
                       made: NewFolders | None = None) -> CheckpointSession:
    """Checkpoints: resume (explicit or newest intact), then periodic/signal/crash/final
    saves. Restores counters and the data order so a resume continues mid-epoch. When the
    resume fails, the Monitor is closed and the folders `made` for this run are taken back."""
    try:
        return _open_session(trainer, mon, loaders)
    except BaseException as exc:
        if made is not None:
            try:
                mon.close(error=exc)  # its writer thread stops before its folder goes
            except Exception:  # noqa: BLE001 - the resume's error is the one to report
                pass
            made.remove()
        raise


def _open_session(trainer: TrainerView, mon: Any, loaders: Any) -> CheckpointSession:
    from trainspeed.engine.checkpoint.sharded import ShardedIO
    from trainspeed.engine.distributed import OptimizerLoader, crash_agreement, signal_agreement

    st = trainer.state
    fsdp, every_rank = trainer.dist.fsdp, trainer.dist.sharded_saves
    if every_rank:
        # Every rank writes its shards (FSDP, sharded.py) or ZeRO partitions (DeepSpeed,
        # deepspeed_io.py) of every save. Signal and crash saves need all ranks, so the ranks
        # agree on them first (distributed.py).
        timeout = min(trainer.dist.timeout_s, 30.0)
        if fsdp:
            io: Any = ShardedIO(trainer.eager, trainer.optimizer, process_group=trainer._ckpt_group,
                                world_size=trainer.world_size, tag=trainer._ckpt_tag)
        else:
            from trainspeed.engine.checkpoint.deepspeed_io import DeepSpeedIO
            from trainspeed.engine.deepspeed_config import zero_stage

            io = DeepSpeedIO(trainer._ds, world_size=trainer.world_size, tag=trainer._ckpt_tag,
                             zero_stage=zero_stage(trainer.ds_config))
        extra = dict(
            sharded=io,
            agree_signal=signal_agreement(trainer.dist, trainer._agree_group,
                                          trainer.cfg.distributed.signal_check_every),
            agree_crash=crash_agreement(trainer.dist, trainer._agree_group, timeout, lambda: st.step))
    else:
        # Loads a sharded checkpoint into this unsharded model (another world size: DCP
        # reshards); DDP and single-process runs save single files.
        extra = dict(sharded=ShardedIO(trainer.eager, trainer.optimizer, world_size=trainer.world_size))
    # Rank 0 writes single-file checkpoints; under DDP only rank 0 handles signals (its
    # state is everyone's), under FSDP and DeepSpeed every rank does and they agree (see above).
    ckpt = CheckpointSession.from_config(
        trainer.cfg.checkpoint, trainer.run_dir, monitor=mon,
        handle_signals=trainer.rank == 0 or every_rank, writer=trainer.rank == 0,
        on_checkpoint=lambda info: trainer.callbacks.fire(Event.CHECKPOINT, _with_info(st, info)),
        **extra)

    c = trainer.cfg
    if c.checkpoint.keep_best and c.checkpoint.best_metric.startswith("val") and c.eval.every_steps is None \
            and trainer.rank == 0:
        # `checkpoint.keep_best=2 checkpoint.best_metric=val_loss` alone (README) kept nothing: no
        # periodic checkpoint carries a validation metric without evaluations during training
        mon.event("warning", kind="best_metric_missing", message=(
            f"checkpoint.keep_best={c.checkpoint.keep_best} keeps the checkpoints with the best "
            f"{c.checkpoint.best_metric}, which only evaluations during training measure: set eval.every_steps "
            f"(e.g. eval.every_steps={c.checkpoint.every_steps or 'N'}), or no checkpoint is kept as best"))
    if fsdp:
        model, optimizer = trainer._fsdp_state.load_views()
    elif trainer._ds is not None:
        from trainspeed.engine.checkpoint.deepspeed_io import RefuseSingleFile

        model, optimizer = RefuseSingleFile("model"), RefuseSingleFile("optimizer")
    else:
        model, optimizer = trainer.eager, OptimizerLoader(trainer.eager, trainer.optimizer, sharded=False)
    ckpt.run_name = trainer.run_dir.name
    target = trainer._resume_target
    if target is not None:  # found and verified already (check_resume): not searched and hashed again
        ckpt.resume_spec = str(target.path)
        ckpt.manager.skipped.extend(target.skipped)
    resumed = ckpt.resume(model, optimizer, trainer.scheduler, trainer.precision)
    if resumed is not None:
        c = resumed.counters
        st.step, st.epoch, st.samples, st.tokens, st.batch_in_epoch = (
            c.step, c.epoch, c.samples, c.tokens, c.batch_in_epoch)
        if loaders.train_bundle is not None and resumed.sampler is not None:
            loaders.train_bundle.load_state_dict(resumed.sampler)
        mon.steps_done = st.step  # step records continue the resumed run's numbering
        mon.event("restart", path=str(resumed.path), at_step=st.step)
        _name_lost_records(mon, st.step)
    return ckpt


def _name_lost_records(mon: Any, resumed_at: int) -> None:
    """A run killed (kill -9, a dead node) after a checkpoint was published but before the
    records of its last steps reached the disk leaves those steps without a record: a gap the
    resume cannot fill, so it is named (an event and one line), never silent. Killed after
    steps its last checkpoint does not hold, it recorded steps the resume runs again: that is
    said too, and the run's reader keeps their new records (telemetry/rundir._last_runs)."""
    from trainspeed.telemetry.rundir import last_recorded_step

    if mon.run_dir is None:
        return
    last = last_recorded_step(mon.run_dir)
    if last is not None and last > resumed_at:  # killed after steps the checkpoint does not hold
        span = f"step {last}" if last == resumed_at + 1 else f"steps {resumed_at + 1}-{last}"
        message = (f"{span} ran after the step-{resumed_at} checkpoint and run again now; the reports read "
                   "their new records (the earlier ones stay in steps.jsonl, superseded)")
        mon.event("note", kind="records_rerun", first_step=resumed_at + 1, last_step=last, message=message)
        if mon.rank == 0:
            print(f"trainspeed: {message}", file=sys.stderr, flush=True)
        return
    if last is None or last >= resumed_at:
        return
    first = last + 1
    span = f"step {first}" if first == resumed_at else f"steps {first}-{resumed_at}"
    message = (f"{span} ran before the previous process stopped, but {'its record' if first == resumed_at else 'their records'} "
               "did not reach steps.jsonl (the checkpoint did): those steps have no step record")
    mon.event("warning", kind="records_lost", first_step=first, last_step=resumed_at, message=message)
    if mon.rank == 0:
        print(f"trainspeed: warning: {message}", file=sys.stderr, flush=True)


def state_fn(trainer: TrainerView, loaders: Any) -> Callable[[], Any]:
    """make_state(): the checkpoint of the trainer as it is now (counters, sampler position,
    model, optimizer, schedule, scaler), or under FSDP the rank's shards plus the rest."""
    from trainspeed.config import config_hash
    from trainspeed.engine.checkpoint.sharded import ShardedState
    from trainspeed.engine.checkpoint.state import TrainState, build_checkpoint

    def make_state() -> dict[str, Any]:
        st = trainer.state
        if trainer._lr_static:  # not stepped: record where it would be
            trainer.scheduler.last_epoch = st.step
        counters = TrainState(step=st.step, epoch=st.epoch, samples=st.samples,
                              tokens=st.tokens, batch_in_epoch=st.batch_in_epoch)
        sampler = loaders.train_bundle.state_dict() if loaders.train_bundle is not None else None
        if trainer.dist.sharded_saves:  # each rank's shards go to DCP or DeepSpeed; rank 0 writes the rest
            rest = build_checkpoint(None, None, trainer.scheduler, trainer.precision, counters,
                                    sampler, config_to_dict(trainer.cfg),
                                    {"world_size": trainer.world_size, "strategy": trainer.dist.strategy},
                                    config_digest=config_hash(trainer.cfg))
            return ShardedState(tensors=trainer._ckpt_session.manager.sharded.state_dicts(), rest=rest)
        return build_checkpoint(trainer.eager, trainer.optimizer, trainer.scheduler, trainer.precision,
                                counters, sampler, config_to_dict(trainer.cfg),
                                None, config_digest=config_hash(trainer.cfg))
    return make_state
