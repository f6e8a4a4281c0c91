"""Exact distributed evaluation: accuracy and loss sums over an evaluation loader sharded without
padding, all-reduced with op="sum"; also gathers per-sample predictions with dp.all_gather."""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpmigrate.runtime.torch as dp

parser = argparse.ArgumentParser()
parser.add_argument("--samples", type=int, default=10)
parser.add_argument("--out", required=True)
args = parser.parse_args()

dp.init()
g = torch.Generator().manual_seed(1)
inputs = torch.randn(args.samples, 4, generator=g)
labels = torch.randint(0, 3, (args.samples,), generator=g)
torch.manual_seed(0)
model = dp.distributed_model(nn.Linear(4, 3))
loader = dp.distributed_loader(DataLoader(TensorDataset(inputs, labels), batch_size=4), evaluation=True)

correct, loss_sum, seen, predictions = 0, 0.0, 0, []
with torch.no_grad():
    for x, y in loader:
        out = model(x)
        loss_sum += nn.functional.cross_entropy(out, y, reduction="sum").item()
        pred = out.argmax(1)
        correct += int((pred == y).sum())
        seen += len(y)
        predictions.append(pred)
correct = dp.all_reduce(correct, op="sum")
loss_sum = dp.all_reduce(loss_sum, op="sum")
seen = dp.all_reduce(seen, op="sum")
gathered = dp.all_gather(torch.cat(predictions))
result = {"accuracy": correct / len(loader.dataset), "loss": loss_sum / len(loader.dataset), "seen": seen,
          "correct": correct, "gathered": sorted(gathered.tolist()), "batches": len(loader)}
if dp.is_main_process():
    with open(args.out, "w") as f:
        json.dump(result, f)
