"""pytorch/examples word_language_model in miniature, in its default mode: parameters are
updated by hand (`p.data.add_(p.grad, alpha=-lr)`, no torch.optim), the batch is sequence-first
((bptt, batch) token ids sliced from a batchified corpus, no DataLoader), and a parameterless
`criterion` module is called next to the model. `--use-optimizer` switches to torch.optim.SGD."""
import argparse
import math

import torch
from torch import nn


class RNNModel(nn.Module):
    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, nhead=2):
        super().__init__()
        self.model_type = rnn_type
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type == "Transformer":
            layer = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout=0.2)  # batch_first=False
            self.rnn = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        else:
            self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=0.2)  # batch_first=False
        self.decoder = nn.Linear(nhid if rnn_type != "Transformer" else ninp, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, input, hidden=None):
        emb = self.drop(self.encoder(input))
        if self.model_type == "Transformer":
            output = self.rnn(emb)
        else:
            output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        return nn.functional.log_softmax(self.decoder(output), dim=-1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def repackage_hidden(h):
    if h is None or isinstance(h, torch.Tensor):
        return None if h is None else h.detach()
    return tuple(repackage_hidden(v) for v in h)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].view(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="LSTM")
    parser.add_argument("--lr", type=float, default=20)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch_size", type=int, default=20)
    parser.add_argument("--bptt", type=int, default=35)
    parser.add_argument("--log-interval", type=int, default=200)
    parser.add_argument("--use-optimizer", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    ntokens = 100
    corpus = torch.randint(0, ntokens, (20 * 35 * 12 + 1,))
    train_data = batchify(corpus, args.batch_size)
    model = RNNModel(args.model, ntokens, 32, 32, 2)
    criterion = nn.NLLLoss()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr) if args.use_optimizer else None
    for epoch in range(args.epochs):
        model.train()
        total_loss = 0.0
        hidden = model.init_hidden(args.batch_size) if args.model != "Transformer" else None
        for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            data, targets = get_batch(train_data, i, args.bptt)
            model.zero_grad()
            hidden = repackage_hidden(hidden)
            output, hidden = model(data, hidden)
            loss = criterion(output.view(-1, ntokens), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            if opt is not None:
                opt.step()
            else:
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-args.lr)
            total_loss += loss.item()
            if batch % args.log_interval == 0 and batch > 0:
                print(f"| epoch {epoch} | loss {total_loss / args.log_interval:5.2f} | "
                      f"ppl {math.exp(total_loss / args.log_interval):8.2f}")
                total_loss = 0.0


if __name__ == "__main__":
    main()
