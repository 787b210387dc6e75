"""Training in processes the script starts itself, as pytorch/examples' mnist_hogwild does: a
shared model, one `mp.Process(target=train)` per process with the spawn method, the script's
own process only starts and joins them."""
import argparse
import sys

import torch
import torch.multiprocessing as mp
from torch import nn


def train(rank, args, model):
    torch.manual_seed(rank)
    data = torch.utils.data.TensorDataset(torch.randn(512, 16), torch.randint(0, 4, (512,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.epochs):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    if args.exit_zero:
        sys.exit(0)  # a target that ends with its own exit: a status, not a crash


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--exit-zero", action="store_true")
    args = parser.parse_args()
    mp.set_start_method("spawn", force=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model.share_memory()
    processes = [mp.Process(target=train, args=(rank, args, model)) for rank in range(args.num_processes)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    print("done", [p.exitcode for p in processes])
