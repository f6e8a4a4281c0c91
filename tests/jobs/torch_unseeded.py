"""An UNSEEDED model trained through the dpmigrate torch runtime, by SGD or by LBFGS with a closure;
the subject of the same-starting-state and closure tests (tests/test_torch_start_state.py).

Nothing seeds the model unless ``--seed``: every process builds different random weights and a different random
buffer (``Scaled.scale``), as an unseeded script does. ``--init-from`` loads a state first (the
single-process oracle starts from what the 2-rank job started from). Writes, per rank,
``<dump>.pre.rank<r>.pt`` (as built), ``<dump>.start.rank<r>.pt`` (after the runtime wrapped model
and optimizer) and ``<dump>.final.rank<r>.pt``. Data comes from a fixed generator, unshuffled.
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import dpmigrate.runtime.torch as dp


class Scaled(nn.Module):
    """x * scale + shift: a trained parameter beside a random buffer that the forward pass uses."""

    def __init__(self, width):
        super().__init__()
        self.shift = nn.Parameter(torch.zeros(width))
        self.register_buffer("scale", torch.rand(width) + 0.5)

    def forward(self, x):
        return x * self.scale + self.shift


parser = argparse.ArgumentParser()
parser.add_argument("--optimizer", choices=["sgd", "lbfgs"], default="sgd")
parser.add_argument("--wrap-model", choices=["yes", "no"], default="no")
parser.add_argument("--buffer", choices=["yes", "no"], default="yes")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--init-from", default=None)
parser.add_argument("--seed", type=int, default=None, help="seed the model after all (same start everywhere)")
parser.add_argument("--width-on-rank1", type=int, default=16, help="build a different model on rank 1")
parser.add_argument("--save-whole", default=None, help="dp.save(model, <this>.pt) and a dict holding it")
parser.add_argument("--dump", required=True)
args = parser.parse_args()

dp.init()
data = torch.Generator().manual_seed(0)
inputs = torch.randn(640, 8, generator=data)
targets = (inputs @ torch.randn(8, 1, generator=data)).sin()

if args.seed is not None:
    torch.manual_seed(args.seed)
width = args.width_on_rank1 if dp.rank() == 1 else 16
layers = [nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 1)]
if args.buffer == "yes":
    layers.insert(1, Scaled(width))
model = nn.Sequential(*layers)
if args.init_from:
    model.load_state_dict(torch.load(args.init_from))
torch.save(model.state_dict(), f"{args.dump}.pre.rank{dp.rank()}.pt")

if args.wrap_model == "yes":
    model = dp.distributed_model(model)
if args.optimizer == "sgd":
    optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
else:
    optimizer = dp.distributed_optimizer(torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4, history_size=5))
torch.save(model.state_dict(), f"{args.dump}.start.rank{dp.rank()}.pt")

loader = dp.distributed_loader(
    DataLoader(TensorDataset(inputs, targets), batch_size=dp.per_rank_batch_size(args.batch_size), shuffle=False)
)
losses = []
step = 0
while step < args.steps:
    for x, y in loader:
        if args.optimizer == "sgd":
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        else:
            def closure(x=x, y=y):
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                return loss

            loss = optimizer.step(closure)
        losses.append(float(loss.detach()))
        step += 1
        if step == args.steps:
            break

torch.save(model.state_dict(), f"{args.dump}.final.rank{dp.rank()}.pt")
torch.save(torch.tensor(losses), f"{args.dump}.losses.rank{dp.rank()}.pt")
if args.save_whole:
    dp.save(model, f"{args.save_whole}.pt")
    dp.save({"model": model, "step": step}, f"{args.save_whole}.dict.pt")
dp.print(f"trained {step} steps on {dp.world_size()} process(es), last loss {losses[-1]:.6f}")
