"""A dcgan-style loop (pytorch/examples dcgan/main.py in miniature): per batch the
discriminator's optimizer steps after two backward passes (the real batch, the generated one),
then the generator's after one. Nothing planted: batches come from memory a batch at a time and
both models compute. Two updates of one batch are not gradient accumulation."""
import argparse

import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    torch.manual_seed(0)
    nz, width = 64, 512
    netG = nn.Sequential(nn.Linear(nz, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 256))
    netD = nn.Sequential(nn.Linear(256, width), nn.LeakyReLU(0.2), nn.Linear(width, width), nn.LeakyReLU(0.2),
                         nn.Linear(width, 1))
    criterion = nn.BCEWithLogitsLoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    data = TensorDataset(torch.randn(8192, 256))
    # a batch-index sampler: one gather per batch, no per-sample collate
    loader = DataLoader(data, sampler=BatchSampler(RandomSampler(data), 64, drop_last=True), batch_size=None)
    step = 0
    while step < args.steps:
        for (real,) in loader:
            b = real.size(0)
            netD.zero_grad()
            errD_real = criterion(netD(real), torch.ones(b, 1))
            errD_real.backward()
            fake = netG(torch.randn(b, nz))
            errD_fake = criterion(netD(fake.detach()), torch.zeros(b, 1))
            errD_fake.backward()
            optimizerD.step()
            netG.zero_grad()
            errG = criterion(netD(fake), torch.ones(b, 1))
            errG.backward()
            optimizerG.step()
            step += 1
            if step % 100 == 0:
                print(f"[{step}] Loss_D {(errD_real + errD_fake).item():.4f} Loss_G {errG.item():.4f}")


if __name__ == "__main__":
    main()
