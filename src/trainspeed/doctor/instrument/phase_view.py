"""The Monitor as the doctor's hooks see it (`Session.mon`)."""

from __future__ import annotations

from typing import Any, Protocol


class DataSpan(Protocol):
    """What HookPhases uses of its doctor Session (which meets this without naming it, so
    this module never imports session, which imports it): the open "data" span."""

    data_open: bool

    def close_data(self) -> None: ...


class HookPhases:
    """The Monitor as the hooks see it: a phase transition first ends an open data span (the
    main process's batch building lasts until the next thing any hook sees). Everything else
    is the Monitor's own (looked up per call: a profiler window shadows begin/end)."""

    __slots__ = ("monitor", "session")

    def __init__(self, monitor: Any, session: DataSpan) -> None:
        self.monitor = monitor
        self.session = session

    def begin(self, name: str) -> None:
        if self.session.data_open:
            self.session.close_data()
        self.monitor.begin(name)

    def end(self, name: str) -> None:
        if self.session.data_open:
            self.session.close_data()
        self.monitor.end(name)

    def step(self, **kwargs: Any) -> None:
        # the span carries over into the next step, as any open phase does
        self.monitor.step(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.monitor, name)


__all__ = ["DataSpan", "HookPhases"]
