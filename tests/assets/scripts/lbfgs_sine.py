"""pytorch/examples time_sequence_prediction in miniature: an LSTMCell sequence model trained
with LBFGS and a closure (many forward/backward evaluations of one batch per step), then per
step a prediction under torch.no_grad() and a "plot" of it written to disk outside the no_grad
block (the real script draws with matplotlib and saves a PDF)."""
import argparse
import time

import numpy as np
import torch
from torch import nn


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 16)
        self.linear = nn.Linear(16, 1)

    def forward(self, input, future=0):
        outputs = []
        h = torch.zeros(input.size(0), 16, dtype=input.dtype)
        c = torch.zeros(input.size(0), 16, dtype=input.dtype)
        output = None
        for input_t in input.split(1, dim=1):
            h, c = self.lstm1(input_t, (h, c))
            output = self.linear(h)
            outputs += [output]
        for _ in range(future):
            h, c = self.lstm1(output, (h, c))
            output = self.linear(h)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def draw(y, i):
    """Stands for matplotlib: a figure's worth of work on the host, then a file."""
    xs = np.linspace(0, 1, 20000)
    for row in y:
        np.interp(xs, np.linspace(0, 1, row.size), row)
    time.sleep(0.02)  # rendering the figure
    np.savetxt(f"predict{i % 2}.txt", y[:, :200])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15)
    opt = parser.parse_args()
    np.random.seed(0)
    torch.manual_seed(0)
    T, L, N = 20, 60, 12
    x = np.empty((N, L), np.int64)
    x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
    data = np.sin(x / 1.0 / T).astype("float64")
    input = torch.from_numpy(data[3:, :-1])
    target = torch.from_numpy(data[3:, 1:])
    test_input = torch.from_numpy(data[:3, :-1])
    test_target = torch.from_numpy(data[:3, 1:])
    seq = Sequence().double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8)
    for i in range(opt.steps):
        def closure():
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            loss.backward()
            return loss
        optimizer.step(closure)
        with torch.no_grad():
            future = 20
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, :-future], test_target)
            y = pred.detach().numpy()
        draw(y, i)


if __name__ == "__main__":
    main()
