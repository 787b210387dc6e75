"""What gets past a script's `ModuleNotFoundError` under the doctor: the package installed in
trainspeed's interpreter (named as pip names it), or, when the module is part of the script's
own checkout, that checkout's root on the import path.

The second case is the usual one in repositories that keep their package beside example
scripts (karpathy/minGPT's `projects/adder/adder.py` imports `mingpt`, a directory two levels
up): `python projects/adder/adder.py` puts only `projects/adder` on the path, so the import fails
unless the checkout was installed (`pip install -e .`), and "pip install mingpt" would fetch
something else or nothing.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Callable

from trainspeed.doctor.command_words import script_words

__all__ = ["missing_module_advice", "missing_name", "local_package_root"]

# Import names whose pip package is named otherwise.
PIP_NAMES = {"cv2": "opencv-python", "PIL": "pillow", "sklearn": "scikit-learn", "yaml": "pyyaml",
             "skimage": "scikit-image", "google.protobuf": "protobuf", "bs4": "beautifulsoup4"}
_SEARCH_UP = 6  # directories above the script's own, at most (a checkout's root is near)


def missing_name(error: str) -> str | None:
    """`pkg.sub` out of "ModuleNotFoundError: No module named 'pkg.sub'", else None."""
    if "No module named" not in error:
        return None
    return error.split("No module named", 1)[-1].strip().strip("'\"") or None


def script_path(command: list[str] | None, cwd: str | None) -> Path | None:
    """The script a recorded `python [opts] script.py ARGS` command ran, made absolute (None for
    `python -m module`)."""
    words = script_words(command or [])
    if not words or words[0] in ("-m", "-c"):
        return None
    path = Path(words[0])
    return path if path.is_absolute() else Path(cwd or os.getcwd()) / path


def local_package_root(top: str, script: Path | None) -> Path | None:
    """The directory above the script's own that holds `top` as a package (`top/`) or a module
    (`top.py`): what has to be on the import path for the script to find it. None when the
    script's own directory has it (then the path was not the problem) or no directory near has."""
    if script is None:
        return None
    here = script.resolve().parent
    if (here / top).is_dir() or (here / f"{top}.py").is_file():
        return None
    for parent in list(here.parents)[:_SEARCH_UP]:
        if (parent / top / "__init__.py").is_file() or (parent / f"{top}.py").is_file():
            return parent
        if (parent / ".git").exists():  # a checkout's root: its package is not further up
            return None
    return None


def _shown(path: Path, cwd: str | None) -> str:
    """`path` as the user would type it from the directory they ran in: relative while that
    stays short (`.`, `../..`), else absolute."""
    rel = os.path.relpath(path, Path(cwd or os.getcwd()).resolve())
    return str(path) if rel.startswith(os.pardir + os.sep + os.pardir + os.sep + os.pardir) else rel


def missing_module_advice(error: str, command: list[str] | None, cwd: str | None,
                          doctor_command: Callable[[str | None], str], install_hint: str) -> tuple[str, str]:
    """(recommendation, verify command) for a run that died on a missing module;
    `doctor_command(path)`: the doctor on the run's command, with `path` first on PYTHONPATH."""
    name = missing_name(error)
    top = name.split(".")[0] if name else None
    script = script_path(command, cwd)
    root = local_package_root(top, script) if top else None
    if root is not None and script is not None:
        shown = _shown(root, cwd)
        kind = "package" if (root / top).is_dir() else "module"
        where = _shown(root / top, cwd) + ("/" if kind == "package" else ".py")
        if "/" not in where.rstrip("/"):  # `./mingpt/`: a name alone reads as a word
            where = "./" + where
        installable = (root / "pyproject.toml").is_file() or (root / "setup.py").is_file()
        return (f"`{top}` is a {kind} of this checkout ({where}), "
                f"but Python puts only the script's own directory ({_shown(script.resolve().parent, cwd)}) on "
                f"the import path: add the checkout's root, `PYTHONPATH={shlex.quote(shown)}` as the command "
                f"below does"
                + (f", or install the checkout once (`python -m pip install -e {shlex.quote(shown)}`)"
                   if installable else ""),
                doctor_command(shown))
    pip = PIP_NAMES.get(name or "", PIP_NAMES.get(top or "", top))
    return ("the doctor runs your script in the Python that trainspeed is installed in, so the script's "
            "packages must be installed there too: "
            + (f"`python -m pip install {pip}` in that environment" if pip else "install what the script imports")
            + f", or install trainspeed into the environment your script already runs in ({install_hint})",
            doctor_command(None))
