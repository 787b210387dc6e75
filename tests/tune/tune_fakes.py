"""A synthetic trial runner: step times from a table of per-setting effects, no processes."""

from __future__ import annotations

import hashlib

import numpy as np

from trainspeed.tune.trials import TrialRequest, TrialResult


class FakeRunner:
    """Each override multiplies the step time by effects[override] (default 1.0).

    noisy: overrides whose trials get 40% step-time noise; losses: override -> loss;
    fail: overrides whose trial fails (an OOM); wall_s: the budget cost of one trial;
    mfu: the baseline's MFU (a setting's scales with its speed), None for unknown FLOPs.
    """

    def __init__(self, effects=None, *, noisy=(), losses=None, fail=(), wall_s=1.0,
                 base_time=0.1, samples=16, steps=25, mfu=None, warmup=None):
        self.effects = effects or {}
        self.warmup = warmup or {}  # override -> seconds of warm-up steps (compilation); else 0.5
        self.noisy, self.losses, self.fail = set(noisy), losses or {}, set(fail)
        self.wall_s, self.base_time, self.samples, self.steps = wall_s, base_time, samples, steps
        self.calls: list[TrialRequest] = []
        self.mfu = mfu

    def __call__(self, req: TrialRequest) -> TrialResult:
        self.calls.append(req)
        seed = int(hashlib.sha256(f"{req.key}-{req.repeat}".encode()).hexdigest()[:8], 16)
        rng = np.random.default_rng(seed)
        common = dict(key=req.key, label=req.label, repeat=req.repeat, wall_s=self.wall_s)
        if set(req.overrides) & self.fail:
            return TrialResult(ok=False, error="OOM (exit 1): CUDA out of memory", **common)
        factor, noise, loss, samples, warmup = 1.0, 0.01, 2.0, self.samples, 0.5
        for o in req.overrides:
            factor *= self.effects.get(o, 1.0)
            warmup = self.warmup.get(o, warmup)
            noise = 0.4 if o in self.noisy else noise
            loss = self.losses.get(o, loss)
            if o.startswith("data.batch_size="):
                samples = int(o.split("=")[1])
        times = self.base_time * factor * (1 + noise * rng.standard_normal(self.steps))
        return TrialResult(ok=True, step_times=np.abs(times).tolist(),
                           samples=[float(samples)] * self.steps, loss=loss,
                           memory_peak=1e9 * samples / self.samples,
                           mfu=None if self.mfu is None else self.mfu / factor,
                           peak_name=None if self.mfu is None else "fake peak", warmup_s=warmup, **common)
