"""A dataset that applies nn.Module transforms per sample (torchvision v2 style: transforms are
nn.Modules without parameters) in the main process (num_workers=0), to a small CNN. Planted:
the per-sample transforms: data loading, not the model's forward."""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RandomResizedCropish(nn.Module):
    def forward(self, img):
        img = nn.functional.interpolate(img[None], size=(48, 48), mode="bilinear", align_corners=False)[0]
        return img[:, 8:40, 8:40]


class RandomHorizontalFlip(nn.Module):
    def forward(self, img):
        return img.flip(-1) if torch.rand(()) < 0.5 else img


class GaussianBlurish(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.ones(3, 1, 5, 5) / 25)

    def forward(self, img):
        for _ in range(6):
            img = nn.functional.conv2d(img[None], self.k, padding=2, groups=3)[0]
        return img


class Images(Dataset):
    def __init__(self):
        self.data = torch.rand(2048, 3, 40, 40)
        self.transform = nn.Sequential(RandomResizedCropish(), RandomHorizontalFlip(), GaussianBlurish())

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.transform(self.data[i]), i % 10


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Images(), batch_size=32, shuffle=True, num_workers=0)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1


if __name__ == "__main__":
    main()
