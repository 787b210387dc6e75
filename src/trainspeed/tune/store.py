"""The tune's memory of finished trials (`<out>/tune.jsonl`), so an interrupted tune resumes.

One JSON line per finished trial, keyed by the trial's config key (a hash of the base config
and the setting's overrides) and its repeat number. A rerun with the same --out reuses every
finished trial whose key matches; a changed config or trial length gives new keys, so stale
results are never mixed in. A line cut short by a crash is skipped, not fatal.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainspeed.tune.trials import TrialResult

STORE_FILE = "tune.jsonl"


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
        """Append one finished trial; flushed and fsynced so a kill right after keeps it."""
        self._results[(result.key, result.repeat)] = result
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(result.to_json(), allow_nan=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
