"""A small Hugging Face Accelerate training loop on the CPU: `accelerate launch [--multi_gpu --num_processes 2] accelerate_train.py --steps N`."""
import argparse
import torch
from accelerate import Accelerator

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--batch_size", type=int, default=16)
args = p.parse_args()
acc = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(2048, 32), torch.randn(2048, 1))
loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True)
model, opt, loader = acc.prepare(model, opt, loader)
step = 0
while step < args.steps:
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        step += 1
        if step >= args.steps:
            break
acc.print(f"done {step} steps, world {acc.num_processes}")
