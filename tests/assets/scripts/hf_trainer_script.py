"""A Hugging Face Trainer script with a planted problem: every sequence is padded to 256
tokens although most are 10-40 long, so most of each batch is padding. No download: the
model is a tiny GPT-2 built from a config."""
import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

MAX_LEN = 256


class PaddedText(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.lengths = torch.randint(10, 41, (n,), generator=g).tolist()
        self.rows = [torch.randint(1, 100, (length,), generator=g) for length in self.lengths]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        ids = torch.zeros(MAX_LEN, dtype=torch.long)  # pad id 0, padded to the maximum length
        ids[: len(row)] = row
        mask = torch.zeros(MAX_LEN, dtype=torch.long)
        mask[: len(row)] = 1
        labels = ids.masked_fill(mask == 0, -100)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", default="hf_out")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=MAX_LEN, n_embd=32, n_layer=1,
                                       n_head=2, n_inner=64, bos_token_id=1, eos_token_id=1))
    targs = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=8,
                              learning_rate=1e-3, logging_steps=10, save_strategy="no", report_to=[],
                              use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    Trainer(model=model, args=targs, train_dataset=PaddedText(256)).train()


if __name__ == "__main__":
    main()
