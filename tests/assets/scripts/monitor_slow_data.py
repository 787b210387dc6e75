"""A user's own training loop timed by trainspeed.Monitor (the README's Monitor example), whose
Dataset does slow per-sample work in the training process (num_workers=0): data-bound.

    python monitor_slow_data.py RUN_DIR [STEPS]
"""

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainspeed import Monitor


class SlowDataset(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.0005)  # decoding/augmenting a sample: 8 a batch, ~4 ms
        x = torch.full((32,), float(i % 7))
        return x, x[:1]


def main() -> None:
    torch.set_num_threads(1)
    run_dir, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 100
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(), batch_size=8, num_workers=0)
    mon = Monitor(run_dir, log_every=25, warmup_steps=2, system_sampler=False)
    for step, (x, y) in enumerate(mon.loader(loader)):
        with mon.phase("forward"):
            loss = nn.functional.mse_loss(model(x), y)
        with mon.phase("backward"):
            loss.backward()
        with mon.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        mon.step(samples=len(x), loss=loss)
        if step + 1 == steps:
            break
    t0, queued0 = time.perf_counter(), queued_s()
    mon.close()
    wall = time.perf_counter() - t0
    # close's own time: its wall time less the time it sat runnable while other processes had the
    # cores (a loaded machine's share), its waits on threads and files kept
    print(f"close_s={wall - (queued_s() - queued0):.4f} wall_s={wall:.4f}")


def queued_s() -> float:
    """Seconds this thread has waited for a CPU so far (Linux schedstat; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


if __name__ == "__main__":
    main()
