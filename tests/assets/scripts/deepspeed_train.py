"""A DeepSpeed training script as people write them (ZeRO-2, bf16 from ds_config.json).

Planted problem: `engine.save_checkpoint` every `--save-every` steps (default 2): each save
writes the bf16 module, the fp32 ZeRO partitions and the optimizer state.

    python deepspeed_train.py --deepspeed_config deepspeed_config.json --save-every 2
    deepspeed --num_gpus 2 deepspeed_train.py --deepspeed_config deepspeed_config.json
"""
import argparse
import os
import tempfile

import deepspeed
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class BigramLM(nn.Module):
    """Next-byte prediction from hashed byte bigrams: a large embedding table (most of the
    parameters, and cheap to run: a lookup) and a small MLP head."""

    def __init__(self, buckets: int = 1 << 16, dim: int = 64, vocab: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(buckets, dim)
        self.head = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, vocab))

    def forward(self, bigrams: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(bigrams))
        return nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def main() -> None:
    parser = argparse.ArgumentParser(description="BigramLM with DeepSpeed")
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--save-every", type=int, default=2, help="save a checkpoint every N optimizer steps")
    parser.add_argument("--save-dir", default=None)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--autocast", action="store_true", help="also wrap the forward in torch.autocast")
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    torch.manual_seed(0)
    data = torch.randint(0, 256, (2048, 34))
    bigrams = data[:, :-2] * 256 + data[:, 1:-1]
    dataset = TensorDataset(bigrams, data[:, 2:])
    model = BigramLM()
    # no weight decay on biases (two parameter groups: ZeRO steps the torch optimizer once per group)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
    engine, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=groups)
    sampler = DistributedSampler(dataset, num_replicas=engine.dp_world_size, rank=engine.global_rank)
    loader = DataLoader(dataset, batch_size=engine.train_micro_batch_size_per_gpu(), sampler=sampler)
    save_dir = args.save_dir or tempfile.mkdtemp(prefix="ds-ckpt-")

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for bigrams, targets in loader:
            bigrams, targets = bigrams.to(engine.device), targets.to(engine.device)
            if args.autocast:
                with torch.autocast(engine.device.type, dtype=torch.bfloat16):
                    loss = engine(bigrams, targets)
            else:
                loss = engine(bigrams, targets)
            engine.backward(loss)
            engine.step()
            if engine.global_steps == step:
                continue  # a micro-batch of gradient accumulation: no optimizer step yet
            step = engine.global_steps
            if step % args.log_every == 0 and engine.global_rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
            if step % args.save_every == 0:
                engine.save_checkpoint(save_dir, tag=f"step{step}")


if __name__ == "__main__":
    main()
