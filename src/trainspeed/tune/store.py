"""The tune's memory of finished trials (`<out>/tune.jsonl`), so an interrupted tune resumes.

One JSON line per finished trial, keyed by the trial's config key (a hash of the base config
and the setting's overrides) and its repeat number. A rerun with the same --out reuses every
finished trial whose key matches; a changed config or trial length gives new keys, so stale
results are never mixed in. A line cut short by a crash is skipped, not fatal.

A trial that failed because the disk under --out was full is not a measurement of its setting:
it is never stored (the store raises ENOSPC instead, so the tune stops and says how to resume),
and one an earlier tune stored is not reused. A tune on a full disk stored the verification
trial that failed with exit code 120 (its output could not be flushed), and the resumed tune,
with space freed, reused it: threads=1, measured 8.9x faster, read 'failed' and was dropped.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from trainspeed.engine.checkpoint.space import nearly_full, text_says_no_space
from trainspeed.tune.trials import TrialResult

STORE_FILE = "tune.jsonl"


def _says_no_space(result: TrialResult) -> bool:
    return not result.ok and text_says_no_space(result.error or "")


def failed_for_space(result: TrialResult, out_dir: str | os.PathLike) -> bool:
    """True when `result` failed and the disk under `out_dir` is full: its error says so, or
    less than 1 MiB is free there (space.nearly_full: a trial writes ~30 kB, and one that
    cannot flush its output exits 120 with nothing on stderr)."""
    return not result.ok and (_says_no_space(result) or nearly_full(out_dir))


class TrialStore:
    def __init__(self, out_dir: str | os.PathLike):
        self.path = Path(out_dir) / STORE_FILE
        self._results: dict[tuple[str, int], TrialResult] = {}
        self.skipped_lines = 0
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    result = TrialResult.from_json(json.loads(line))
                except (ValueError, TypeError):
                    self.skipped_lines += 1
                    continue
                if _says_no_space(result):  # the disk's failure, not the setting's: run again
                    continue
                self._results[(result.key, result.repeat)] = result

    def get(self, key: str, repeat: int) -> TrialResult | None:
        return self._results.get((key, repeat))

    def of_key(self, key: str) -> list[TrialResult]:
        """Every stored repeat of `key`, in repeat order (numbers may have gaps: a round the
        budget cut short leaves some out)."""
        return sorted((r for (k, _), r in self._results.items() if k == key), key=lambda r: r.repeat)

    def __len__(self) -> int:
        return len(self._results)

    def add(self, result: TrialResult) -> None:
        """Append one finished trial; flushed and fsynced so a kill right after keeps it. A trial
        that failed for a full disk is not kept: OSError(ENOSPC) stops the tune instead."""
        if failed_for_space(result, self.path.parent):
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (trial {result.label} failed: "
                          f"{(result.error or '').splitlines()[0] if result.error else 'no error text'})",
                          str(self.path.parent))
        self._results[(result.key, result.repeat)] = result
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(result.to_json(), allow_nan=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
