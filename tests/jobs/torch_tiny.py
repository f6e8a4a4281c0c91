"""The smallest correct 2-rank job: init, DDP, 5 SGD steps, then collectives right before exit.

Ending on collectives is the point: their tensors are released by gloo's worker threads after the
script has seen the results, which is what used to abort ranks at exit (see
dpmigrate/runtime/_torch_teardown.py). Used by benchmarks/torch_exit.py.
"""

import torch
from torch import nn

import dpmigrate.runtime.torch as dp

dp.init()
torch.manual_seed(0)
model = dp.distributed_model(nn.Linear(4, 1))
optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
for _ in range(5):
    optimizer.zero_grad()
    model(torch.ones(8, 4)).sum().backward()
    optimizer.step()
total = dp.all_reduce(float(model.weight.sum()), op="sum")
gathered = dp.all_gather(torch.full((2,), float(dp.rank())))
dp.print(f"ok {total:.4f} {gathered.tolist()}")
