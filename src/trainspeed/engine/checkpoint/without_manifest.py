"""A checkpoint file named to resume from that came without its manifest: `step-N.pt` copied
to another machine alone, or a directory of them copied without the `.json` files. Such a
file is verified by what it holds itself instead of being refused.

torch.save writes a zip archive that records a CRC-32 of every member (the pickle and each
tensor's storage), so the file's own records catch what the manifest's sha256 would: a copy
cut short (no zip directory at its end) and changed bytes (a member whose CRC-32 differs).
Only a file saved with CRC-32s switched off (torch.serialization.set_crc32_options(False))
holds nothing to check it by: that one needs its manifest, and the error names the file.

Used for checkpoints a user names (checkpoint.resume); the run's own directory (auto_resume,
"latest") still trusts a payload only with its manifest (atomic.py).
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import Any

from trainspeed.engine.checkpoint.atomic import load_verified, manifest_path
from trainspeed.engine.checkpoint.listing import verify_checkpoint
from trainspeed.errors import CheckpointError

VERIFIED_BY = "zip CRC-32"
_CHUNK = 8 << 20


def has_manifest(path: str | Path) -> bool:
    return manifest_path(path).exists()


def verify_contents(path: str | Path) -> dict[str, Any]:
    """Check a checkpoint file by the CRC-32s its zip records; a manifest-like dict (file,
    bytes, verified_by), or CheckpointError saying which file is missing or damaged and what
    to copy."""
    path = Path(path)
    manifest = manifest_path(path).name
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file does not exist")
    size = path.stat().st_size
    recopy = (f"Copy {path.name} again from the machine that saved it, with {manifest} beside it "
              "(its checksum verifies the copy)")
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if not any(m.CRC for m in members if m.file_size):
                raise CheckpointError(
                    f"{path}: its checksum manifest {manifest} is missing and the file records no "
                    "CRC-32s (saved with torch.serialization.set_crc32_options(False)), so nothing "
                    f"can verify it. Copy {manifest} from the directory it was saved in beside it, "
                    "then resume again.")
            for member in members:
                # zipfile compares the member's CRC-32 once it is read to its end
                with archive.open(member) as stream:
                    while stream.read(_CHUNK):
                        pass
    except zipfile.BadZipFile as exc:
        what = ("is cut short or is not a torch checkpoint (no zip directory at its end)"
                if "not a zip file" in str(exc) else f"is damaged ({exc})")
        raise CheckpointError(f"{path}: the file ({size} bytes) {what}, and its checksum manifest "
                              f"{manifest} is missing. {recopy}.") from exc
    except (EOFError, OSError, zlib.error, ValueError) as exc:
        raise CheckpointError(f"{path}: the file ({size} bytes) could not be read to its end "
                              f"({exc!r}), and its checksum manifest {manifest} is missing. "
                              f"{recopy}.") from exc
    return {"file": path.name, "bytes": size, "verified_by": VERIFIED_BY}


def verify_named(path: str | Path) -> dict[str, Any]:
    """verify_checkpoint(path) for a checkpoint the user named: a file without its manifest is
    checked by its own CRC-32s (verify_contents) rather than refused."""
    if Path(path).is_file() and not has_manifest(path):
        return verify_contents(path)
    return verify_checkpoint(path)


def load_named(path: str | Path, map_location: Any = "cpu") -> tuple[dict[str, Any], dict[str, Any]]:
    """(the checkpoint, its manifest) of a file the user named, verified by verify_named."""
    manifest = verify_named(path)
    return load_verified(path, map_location=map_location, verified=True), manifest
