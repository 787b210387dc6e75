"""Knowledge distillation with an EMA copy of the student: per batch a frozen teacher runs under
torch.no_grad() (inside the training step: not an evaluation), the student trains on its soft
targets, and an exponential moving average of the student's weights is updated. Nothing
planted: in-memory batches, compute-bound."""
import argparse
import copy

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(128, 1024), nn.ReLU(), nn.Linear(1024, 10)).eval()
    for q in teacher.parameters():
        q.requires_grad_(False)
    student = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 10))
    ema = copy.deepcopy(student)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9)
    data = TensorDataset(torch.randn(8192, 128))
    loader = DataLoader(data, sampler=BatchSampler(RandomSampler(data), 128, drop_last=True), batch_size=None)
    step = 0
    while step < args.steps:
        for (x,) in loader:
            with torch.no_grad():
                soft = torch.softmax(teacher(x) / 2.0, -1)
            loss = nn.functional.kl_div(torch.log_softmax(student(x) / 2.0, -1), soft, reduction="batchmean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for pe, ps in zip(ema.parameters(), student.parameters()):
                    pe.mul_(0.999).add_(ps, alpha=0.001)
            step += 1


if __name__ == "__main__":
    main()
