"""The DeepSpeed usage of DeepSpeedExamples' training/HelloDeepSpeed/train_bert_ds.py
(microsoft/DeepSpeedExamples@83757d9), small and offline: the config is a dict built in the
code and passed to `deepspeed.initialize(config=...)` (ZeRO-1, bf16, the optimizer offloaded to
the CPU), `loss.item()` every step into a growing list, and `engine.save_checkpoint(save_dir=...,
client_state=...)` with no tag every `--checkpoint_every` steps. The one change from it:
"torch_adam": true, so that no DeepSpeedCPUAdam op has to be compiled for a test.

    python deepspeed_hello_style.py --checkpoint_dir /tmp/exp --checkpoint_every 4
"""
import argparse

import deepspeed
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class TinyMLM(nn.Module):
    def __init__(self, vocab: int = 2048, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mix = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.out = nn.Linear(dim, vocab)

    def forward(self, src_tokens, tgt_tokens, attention_mask):
        hidden = self.mix(self.embed(src_tokens)) * attention_mask.unsqueeze(-1)
        logits = self.out(hidden).float()
        return nn.functional.cross_entropy(logits.flatten(0, 1), tgt_tokens.flatten(), ignore_index=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint_dir", required=True)
    parser.add_argument("--checkpoint_every", type=int, default=1000)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--num_iterations", type=int, default=10000)
    parser.add_argument("--log_every", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    tokens = torch.randint(5, 2048, (512, 32))
    data = DataLoader(TensorDataset(tokens), batch_size=args.batch_size, shuffle=True)
    model = TinyMLM()
    ds_config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-4, "torch_adam": True}},
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}},
    }
    model, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    model.train()
    losses = []
    step = 0
    while step < args.num_iterations:
        for (batch,) in data:
            step += 1
            batch = batch.to(model.device)
            loss = model(src_tokens=batch, tgt_tokens=batch, attention_mask=torch.ones_like(batch))
            model.backward(loss)
            model.step()
            losses.append(loss.item())
            if step % args.log_every == 0:
                print(f"Loss: {np.mean(losses):.4f}")
            if step % args.checkpoint_every == 0:
                model.save_checkpoint(save_dir=args.checkpoint_dir, client_state={"checkpoint_step": step})
            if step >= args.num_iterations:
                break


if __name__ == "__main__":
    main()
