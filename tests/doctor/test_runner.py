from __future__ import annotations

import sys

import pytest

from trainspeed.doctor.runner import DoctorConfig, Target, execute, exit_code_of, parse_command
from trainspeed.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def test_parse_command_forms(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    assert parse_command(["python", str(script), "--lr", "3"]) == Target("path", str(script), ["--lr", "3"])
    assert parse_command(["--", "python3.11", "-u", "-W", "ignore", str(script)]) == Target("path", str(script), [])
    assert parse_command([str(script), "a"]) == Target("path", str(script), ["a"])
    assert parse_command([sys.executable, "-m", "pkg.train", "--x"]) == Target("module", "pkg.train", ["--x"])


@pytest.mark.parametrize("command, match", [
    ([], "no command"), (["python"], "names no script"), (["python", "-m"], "module name"),
    (["python", "-c", "print(1)"], "not supported"), (["python", "nope.py"], "not found"),
])
def test_parse_command_errors(command, match):
    with pytest.raises(ConfigError, match=match):
        parse_command(command)


def test_config_validation():
    with pytest.raises(ConfigError, match="doctor.steps"):
        DoctorConfig(command=["x.py"], steps=0)
    with pytest.raises(ConfigError, match="doctor.device"):
        DoctorConfig(command=["x.py"], device="tpu")


@pytest.mark.parametrize("code, status", [(None, 0), (0, 0), (3, 3), (True, 1), ("bye", 1), (-1, 255), (256, 0)])
def test_exit_code_of_matches_python(code, status):
    assert exit_code_of(SystemExit(code)) == status


def test_execute_sets_argv_main_and_path_then_restores(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(
        "import sys, helper_mod\n"
        "RESULT.update(argv=list(sys.argv), name=__name__, path0=sys.path[0], helper=helper_mod.X)\n")
    (tmp_path / "helper_mod.py").write_text("X = 7\n")
    result: dict = {}
    import builtins
    builtins.RESULT = result
    argv, path = sys.argv[:], sys.path[:]
    try:
        execute(Target("path", str(script), ["--a", "1"]))
    finally:
        del builtins.RESULT
        sys.modules.pop("helper_mod", None)
    assert result == {"argv": [str(script), "--a", "1"], "name": "__main__", "path0": str(tmp_path), "helper": 7}
    assert sys.argv == argv and sys.path == path
