"""A script that crashes after a few steps (the doctor must still write its report)."""
import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crash-at", type=int, default=12)
    parser.add_argument("--exit-code", type=int, default=None, help="sys.exit(code) instead of raising")
    args = parser.parse_args()
    model = nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    if args.crash_at == 0:  # before the first step (a setup error, an import that fails)
        # with terminal bold inside, as torch.load's weights_only error writes its advice
        raise RuntimeError("planted crash at step 0. \x1b[1mdo this only if you trust it\x1b[0m.\nsecond line")
    for step in range(1, 1000):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == args.crash_at:
            if args.exit_code is not None:
                raise SystemExit(args.exit_code)
            raise RuntimeError(f"planted crash at step {step}")


if __name__ == "__main__":
    main()
