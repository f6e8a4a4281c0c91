"""A small MLP trained with plain SGD through the dpmigrate torch runtime; the subject of the
equivalence, accumulation, LocalSGD and no-double-averaging tests.

Run unlaunched it is the single-process original; under `dpmigrate launch -n 2` with --batch global
each rank takes half of every batch. No randomness: data and initial weights come from fixed seeds and
the loader does not shuffle.
"""

import argparse
import json

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpmigrate.runtime.torch as dp

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--batch", choices=["global", "per-device"], default="global")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--accumulation", type=int, default=1)
parser.add_argument("--localsgd", type=int, default=None)
parser.add_argument("--compression", default=None)
parser.add_argument("--bucket-mb", type=float, default=None)
parser.add_argument("--wrap-model", choices=["yes", "no"], default="yes")
parser.add_argument("--trace", default=None, help="write every rank's parameters after each step here")
parser.add_argument("--count-saves", default=None, help="write how many times this rank called torch.save here")
parser.add_argument("--out", required=True)
args = parser.parse_args()

dp.init(dp.Strategy(
    gradient_accumulation=args.accumulation, localsgd_steps=args.localsgd,
    gradient_compression=args.compression, bucket_size_mb=args.bucket_mb,
))

data = torch.Generator().manual_seed(0)
inputs = torch.randn(640, 8, generator=data)
targets = (inputs @ torch.randn(8, 1, generator=data)).sin()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
if args.wrap_model == "yes":
    model = dp.distributed_model(model)
optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=args.lr))

batch = dp.per_rank_batch_size(args.batch_size) if args.batch == "global" else args.batch_size
loader = dp.distributed_loader(DataLoader(TensorDataset(inputs, targets), batch_size=batch, shuffle=False))

trace = []
step = 0
while step < args.steps:
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        step += 1
        if args.trace:
            trace.append(torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
        if step == args.steps:
            break

if args.count_saves:  # count the real torch.save calls each rank makes inside dp.save
    calls = []
    real_save = torch.save
    torch.save = lambda *a, **k: (calls.append(1), real_save(*a, **k))[1]
dp.save(model.state_dict(), args.out)
if args.count_saves:
    torch.save = real_save
    with open(f"{args.count_saves}.rank{dp.rank()}", "w") as f:
        f.write(str(len(calls)))
if args.trace:
    with open(f"{args.trace}.rank{dp.rank()}.json", "w") as f:
        json.dump(trace, f)
dp.print(f"trained {step} steps on {dp.world_size()} process(es), last loss {loss.item():.6f}")
