"""The environment's steps of a reinforcement-learning loop (gymnasium, or the older gym).

pytorch/examples' reinforce.py spends most of its step outside the training phases, and the
report could only say "other 58 %: what the loop computes itself, an environment's steps, ...":
it did not know how much was CartPole's. Each `env.step(action)` the script calls is timed as a
call site of category "env" (kind "step"), at the script's line: an environment made by
`gym.make` (its outermost wrapper, per instance) and the vector environments' `step`
(SyncVectorEnv, AsyncVectorEnv). A step inside another timed one (a vector environment stepping
environments made by `gym.make`) is not counted twice. The time stays in whatever phase was
open (other, or a rollout's "eval"); checks/bound.py names its share.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from trainspeed.doctor.instrument.imports import PostImportHooks
from trainspeed.doctor.instrument.patching import Patches
from trainspeed.doctor.instrument.session import Session
from trainspeed.doctor.instrument.sites import caller_site

CATEGORY = "env"
VECTOR_CLASSES = ("SyncVectorEnv", "AsyncVectorEnv")


def install(session: Session, patches: Patches, imports: PostImportHooks) -> None:
    depth = [0]  # inside a timed step: a vector environment's own envs are its step's

    def timed(original: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kwargs: Any) -> Any:
            if depth[0] or not session.on():
                return original(*args, **kwargs)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - t0
                depth[0] -= 1
                session.internal += 1
                try:
                    session.sites.add(CATEGORY, "step", caller_site(2), seconds)
                finally:
                    session.internal -= 1

        step.__wrapped__ = original  # type: ignore[attr-defined]
        return step

    def wrap_made(original: Callable[..., Any]) -> Callable[..., Any]:
        def make(*args: Any, **kwargs: Any) -> Any:
            env = original(*args, **kwargs)
            try:
                env.step = timed(env.step)  # this instance only: its wrappers' steps run inside it
            except (AttributeError, TypeError):
                pass
            return env

        make.__wrapped__ = original  # type: ignore[attr-defined]
        return make

    def on_package(module: Any) -> None:
        patches.wrap(module, "make", wrap_made)
        vector = getattr(module, "vector", None)
        for name in VECTOR_CLASSES:
            cls = getattr(vector, name, None) if vector is not None else None
            if isinstance(cls, type):
                patches.wrap(cls, "step", timed)

    imports.add("gymnasium", on_package)
    imports.add("gym", on_package)


__all__ = ["CATEGORY", "install"]
