"""A fork server for trials: one process imports torch and the engine once, then forks a fresh
child per trial.

Why: a trial's process spent ~4 s before its first step on this project's 2-core VMs, ~2 s
importing torch and trainspeed and ~1.8 s in the first `torch.optim.Optimizer(...)`, which
imports torch._dynamo. On trials of 6-15 s that was a third of the tune's budget. A child
forked from a process that already holds those modules starts training at once.

What stays fresh: each trial is still its own process. The server only imports modules. It
runs no torch op, so no thread pool exists yet, nothing is compiled and no tensor memory is
held; the child sizes its threads, compiles and allocates as a fresh process would. The
server refuses to fork when it sees a thread besides its own (forking a threaded process can
copy a held lock), and the client then falls back to plain subprocesses, as it does on
platforms without fork and when a trial needs its own environment variables.

Protocol (JSON lines): the client first writes {"preload": [module, ...]}, the server answers
{"ready", "pid", "skipped"} (or {"error"}); then per trial the client writes {"argv", "stdout",
"stderr", "cwd"} and the server answers {"pid"} when the child starts and {"pid", "returncode"}
when it ends. Between trials {"preload": [...]} again imports more (answered {"ready",
"skipped"}, or {"error"} and the server exits: an import made it unsafe to fork).
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

PRELOAD = ("torch", "torch.optim", "torch._dynamo", "trainspeed.cli.main", "trainspeed.engine.trainer",
           "trainspeed.engine.from_recipe")
"""Imported once by the server: what every trial imports before its first step. The tuner
adds what building the recipe imported (its model library, its data code)."""

START_TIMEOUT_S = 120.0


class ForkServerError(RuntimeError):
    """The server could not start or answer: run trials as plain subprocesses instead."""


def available() -> bool:
    """Whether fork servers can work here (Linux: fork is safe for a process without threads)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


# ------------------------------------------------------------------------- server side
def serve() -> None:
    """The server's loop: requests on stdin, answers on stdout, until stdin closes.

    The first line lists more modules every trial imports ({"preload": [...]}: the recipe's
    model library; transformers with its Qwen2 modeling code is ~1.3 s a trial). Not argv: a
    module that reads sys.argv at import must not see them. One that fails to import (or
    exits) is skipped and named in the ready answer; the trial imports it itself. A thread or
    a CUDA context started by any import is caught by the checks below: the server then
    refuses to fork."""
    from trainspeed.startup import preload

    extra = json.loads(sys.stdin.readline() or "{}").get("preload") or []
    preload(PRELOAD)
    skipped = _import_all(extra)
    # Answers go to a private copy of stdout; fd 1 itself is pointed at stderr, so that nothing
    # else printed in this process (a library's warning) can break the protocol.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    # Ctrl-C reaches the tuner's process group, this server included (each trial has a group
    # of its own, see _child): the tuner kills the trial, and the server must outlive the
    # signal to reap it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    problem = _fork_unsafe()
    if problem:
        out.write(json.dumps({"error": problem}) + "\n")
        return
    out.write(json.dumps({"ready": True, "pid": os.getpid(), "skipped": skipped}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if "preload" in request:  # more modules, between trials (a script's libraries): import, check again
            skipped = _import_all(request["preload"])
            problem = _fork_unsafe()
            out.write(json.dumps({"error": problem} if problem else {"ready": True, "skipped": skipped}) + "\n")
            if problem:
                return
            continue
        pid = os.fork()
        if pid == 0:
            _child(request)  # never returns
        out.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"pid": pid, "returncode": os.waitstatus_to_exitcode(status)}) + "\n")


def _import_all(names: list[str]) -> list[str]:
    """Import each module (the collector paused: trainspeed/startup.py); 'name: error' of each
    that failed or exited (the trial imports it itself and meets the error there)."""
    import importlib

    from trainspeed.startup import gc_paused

    skipped = []
    with gc_paused():
        for name in names:
            try:
                importlib.import_module(name)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - the trial imports it again and reports it
                skipped.append(f"{name}: {type(exc).__name__}: {exc}")
    return skipped


def _fork_unsafe() -> str | None:
    """Why forking this process is unsafe now (a thread or a CUDA context an import started)."""
    if threading.active_count() > 1:
        return f"{threading.active_count()} threads after imports; not fork-safe"
    if sys.modules["torch"].cuda.is_initialized():  # a CUDA context does not survive a fork
        return "an import initialized CUDA; forked trials could not use it"
    return None


def _child(request: dict[str, Any]) -> NoReturn:
    """Run `trainspeed ARGV` in this forked process and leave with its exit code."""
    code = 1
    try:
        # The trial's own process group: the tuner stops it and everything it started (DataLoader
        # workers, a script's subprocesses) with one killpg. A Ctrl-C at the terminal reaches the
        # tuner, which kills the trial (ForkServer.run): a script that catches KeyboardInterrupt
        # (pytorch/examples' word_language_model then evaluates and saves) must not run on
        # after the tune has stopped.
        os.setpgid(0, 0)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # the server's stdin carries requests: not the trial's to read
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdin = open(os.devnull)  # noqa: SIM115 - lives as long as this process
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        if request.get("cwd"):
            os.chdir(request["cwd"])
        sys.argv = ["trainspeed", *request["argv"]]
        from trainspeed.cli.main import main

        code = int(main(list(request["argv"])) or 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - reported on the trial's stderr, like a crashed process
        import traceback

        traceback.print_exc()
        code = 1
    # Leave as an interpreter does, minus the module teardown (~1 s here, for nothing the trial
    # needs): atexit handlers run (torch.compile's worker pool, W&B), stdio is flushed. Never
    # back into the server's loop: this process is the trial's.
    try:
        atexit._run_exitfuncs()  # what Py_Finalize runs first; the public API has no other way
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


# ------------------------------------------------------------------------- client side
def _kill_group(pid: int) -> None:
    """SIGKILL a forked trial and every process in its group (see _child); one already gone
    (or a group not yet made, in the instant after fork) is killed by pid or left."""
    for kill, target in ((os.killpg, pid), (os.kill, pid)):
        try:
            kill(target, signal.SIGKILL)
            return
        except (ProcessLookupError, PermissionError):
            continue


class ForkServer:
    """The tuner's handle on a server process; `run` is subprocess.run for one trial."""

    def __init__(self, python: str = sys.executable, start_timeout_s: float = START_TIMEOUT_S,
                 preload: tuple[str, ...] = ()) -> None:
        self._proc = subprocess.Popen([python, "-m", "trainspeed.tune.forkserver"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            self._proc.stdin.write((json.dumps({"preload": list(preload)}) + "\n").encode())  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
        except OSError:
            pass  # the server died at start: the hello below says so
        self._buffer = b""
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        hello = self._read(start_timeout_s)
        if hello is None or not hello.get("ready"):
            self.close()
            raise ForkServerError(f"fork server did not start: {hello.get('error') if hello else 'no answer'}")
        self.skipped: list[str] = list(hello.get("skipped") or [])
        """Preload modules that failed to import in the server (trials import them themselves)."""

    def preload(self, modules: list[str] | tuple[str, ...], timeout_s: float = START_TIMEOUT_S) -> list[str]:
        """Import more modules in the server, between trials; the ones it skipped. Raises
        ForkServerError when the server is not fork-safe afterwards (it then exits)."""
        try:
            self._proc.stdin.write((json.dumps({"preload": list(modules)}) + "\n").encode())  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
        except OSError as exc:
            raise ForkServerError(f"fork server gone: {exc}") from exc
        answer = self._read(timeout_s)
        if answer is None or not answer.get("ready"):
            raise ForkServerError(f"fork server could not import them: {answer.get('error') if answer else 'no answer'}")
        skipped = list(answer.get("skipped") or [])
        self.skipped += skipped
        return skipped

    def run(self, argv: list[str], stdout: Path, stderr: Path, timeout_s: float | None) -> int:
        """Run `trainspeed ARGV` in a forked child; its exit code. Raises
        subprocess.TimeoutExpired after killing a child that ran past timeout_s."""
        request = {"argv": argv, "stdout": str(stdout), "stderr": str(stderr), "cwd": os.getcwd()}
        requests = self._proc.stdin
        if requests is None:  # never with stdin=PIPE; a clear error rather than an assert
            raise ForkServerError("fork server has no request pipe")
        try:
            requests.write((json.dumps(request) + "\n").encode())
            requests.flush()
        except OSError as exc:
            raise ForkServerError(f"fork server gone: {exc}") from exc
        started = self._read(30.0)
        if started is None or "pid" not in started:
            raise ForkServerError("fork server did not start the trial")
        pid = started["pid"]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            done = self._read(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except BaseException:  # Ctrl-C or a stop signal in the tuner: the trial ends with it
            _kill_group(pid)
            raise
        if done is None:  # past the deadline: stop the child, then collect its status
            _kill_group(pid)
            if self._read(30.0) is None:
                raise ForkServerError("fork server did not report a killed trial")
            raise subprocess.TimeoutExpired(argv, timeout_s or 0.0)
        return int(done["returncode"])

    def _read(self, timeout_s: float | None) -> dict[str, Any] | None:
        """The next answer line, or None when none came within timeout_s (or the server died)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if not self._selector.select(left):
                return None
            chunk = os.read(self._proc.stdout.fileno(), 65536)  # type: ignore[union-attr]
            if not chunk:  # EOF: the server exited
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        """Stop the server (it exits when its stdin closes)."""
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            self._proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._proc.kill()
        self._selector.close()


if __name__ == "__main__":
    serve()
