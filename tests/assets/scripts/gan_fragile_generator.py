"""A GAN-shaped loop with two optimizers, the discriminator's stepping first (the primary, as
dcgan's optimizerD), then the generator's, where bf16 harms only the generator's training.

The discriminator separates two well-apart clouds (BCE on logits of a few units): rounding its
forward to bf16 moves its loss by well under a percent. The generator fits an affine map whose
outputs sit near 300, where bf16 keeps steps of 2: rounded there, its squared error cannot go
below ~1/3, while in fp32 it settles near 0.01 (its target's own noise). A tune's precision=bf16
then keeps optimizerD's loss and breaks optimizerG's: loss parity must judge both. Seeded, so
the baseline's repeats agree. Nothing planted beyond the scale of the generator's target."""
import argparse

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    torch.manual_seed(0)
    dim = 16
    netD = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 1))
    netG = nn.Linear(dim, 1)
    w_true = torch.randn(dim, 1)
    with torch.no_grad():  # the generator starts near its target, offset by 300
        netG.weight.copy_(0.8 * w_true.T)
        netG.bias.fill_(300.0)
    criterion = nn.BCEWithLogitsLoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=1e-3)
    optimizerG = torch.optim.SGD(netG.parameters(), lr=0.02)
    for step in range(args.steps):
        real = torch.randn(64, dim) + 2.0
        noise = torch.randn(64, dim)
        netD.zero_grad()
        errD = criterion(netD(real), torch.ones(64, 1)) + criterion(netD(noise - 2.0), torch.zeros(64, 1))
        errD.backward()
        optimizerD.step()
        netG.zero_grad()
        target = noise @ w_true + 300.0 + 0.1 * torch.randn(64, 1)
        errG = nn.functional.mse_loss(netG(noise), target)
        errG.backward()
        optimizerG.step()
        if step % 50 == 0:
            print(f"[{step}] Loss_D {errD.item():.4f} Loss_G {errG.item():.4f}")


if __name__ == "__main__":
    main()
