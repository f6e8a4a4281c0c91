"""Records which samples each rank reads over 3 epochs, through dp.distributed_loader."""

import argparse
import json

import torch
from torch.utils.data import DataLoader, TensorDataset

import dpmigrate.runtime.torch as dp

parser = argparse.ArgumentParser()
parser.add_argument("--samples", type=int, default=20)
parser.add_argument("--out", required=True)
args = parser.parse_args()

dp.init()
loader = dp.distributed_loader(DataLoader(TensorDataset(torch.arange(args.samples)), batch_size=3, shuffle=True))
epochs = [[int(i) for (batch,) in loader for i in batch] for _ in range(3)]
with open(f"{args.out}.rank{dp.rank()}.json", "w") as f:
    json.dump({"epochs": epochs, "batches": len(loader), "world_size": dp.world_size()}, f)
