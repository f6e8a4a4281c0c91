"""Scripts the command-line tests feed to dpmigrate, and what must come out, written out by hand.

Every expectation here is literal text, never the engine's output: if a rule stops converting
(or converts differently), the CLI and pre-commit tests that use these fail.
"""

from __future__ import annotations

import textwrap

TORCH_SCRIPT = textwrap.dedent('''\
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def main():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        loader = DataLoader(data, batch_size=8, shuffle=True)
        model = nn.Linear(4, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
            print(f"epoch {epoch} loss {loss.item():.4f}")
        torch.save(model.state_dict(), "model.pt")


    if __name__ == "__main__":
        main()
    ''').encode()

CONVERTED_SCRIPT = textwrap.dedent('''\
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    import dpmigrate.runtime.torch as dp


    def main():
        dp.init()
        device = dp.device()
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        loader = dp.distributed_loader(DataLoader(data, batch_size=8, shuffle=True))
        model = nn.Linear(4, 1).to(device)
        model = dp.distributed_model(model)
        optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        for epoch in range(2):
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
            dp.print(f"epoch {epoch} loss {loss.item():.4f}")
        dp.save(model.state_dict(), "model.pt")


    if __name__ == "__main__":
        main()
    ''').encode()

# `--diff` of TORCH_SCRIPT after the two header lines (which name the file).
DIFF_HUNKS = "".join(line + "\n" for line in [
    '@@ -1,14 +1,17 @@',
    ' import torch',
    ' from torch import nn',
    ' from torch.utils.data import DataLoader, TensorDataset',
    '+import dpmigrate.runtime.torch as dp',
    ' ',
    ' ',
    ' def main():',
    '-    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")',
    '+    dp.init()',
    '+    device = dp.device()',
    '     data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))',
    '-    loader = DataLoader(data, batch_size=8, shuffle=True)',
    '+    loader = dp.distributed_loader(DataLoader(data, batch_size=8, shuffle=True))',
    '     model = nn.Linear(4, 1).to(device)',
    '-    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)',
    '+    model = dp.distributed_model(model)',
    '+    optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))',
    '     for epoch in range(2):',
    '         for x, y in loader:',
    '             x, y = x.to(device), y.to(device)',
    '@@ -16,8 +19,8 @@',
    '             loss = nn.functional.mse_loss(model(x), y)',
    '             loss.backward()',
    '             optimizer.step()',
    '-        print(f"epoch {epoch} loss {loss.item():.4f}")',
    '-    torch.save(model.state_dict(), "model.pt")',
    '+        dp.print(f"epoch {epoch} loss {loss.item():.4f}")',
    '+    dp.save(model.state_dict(), "model.pt")',
    ' ',
    ' ',
    ' if __name__ == "__main__":',
])

# The rule behind each change TORCH_SCRIPT needs, in report order.
TORCH_SCRIPT_RULES = ["init-runtime", "rank-device", "shard-training-loader", "distributed-model",
                      "distributed-optimizer", "main-process-print", "distributed-save"]


def torch_script_report(path: str) -> list[str]:
    """The text report's finding lines for TORCH_SCRIPT saved at ``path`` (any mode)."""
    return [
        f"{path}:7:5: change init-runtime: dp.init() at the entry point: joins the job the launcher started "
        "(nothing when run plainly)",
        f'{path}:7:14: change rank-device: torch.device("cuda" if torch.cuda.is_available() else "cpu") -> '
        "dp.device(): this rank's GPU, or the CPU",
        f"{path}:9:14: change shard-training-loader: training DataLoader `loader` sharded: dp.distributed_loader "
        "gives each rank a disjoint part",
        f"{path}:10:5: change distributed-model: model = dp.distributed_model(model) after its set-up: DDP averages "
        "gradients across ranks",
        f"{path}:11:17: change distributed-optimizer: SGD(...) -> dp.distributed_optimizer(...)",
        f"{path}:19:9: change main-process-print: print -> dp.print: printed once, by the main process",
        f"{path}:20:5: change distributed-save: torch.save -> dp.save: rank 0 writes atomically, then all ranks "
        "meet (every rank must reach this line)",
    ]


POLICY = "; --batch per-device: every rank reads the script's batch size, so the global batch is N x it; lr unchanged"
# the summary when the rules that ran sharded no training data (the line says only what was applied)
POLICY_NOTHING_SHARDED = "; --batch per-device: no training data was sharded (every rank reads all of it); lr unchanged"
TORCH_SCRIPT_SUMMARY = "1 file, 1 changed, 7 changes, 0 declined, 0 errors" + POLICY


def converted_script_note(path: str) -> str:
    """What a run reports for CONVERTED_SCRIPT: it is left alone, with a note."""
    return f"{path}:4:1: note detect-framework: already imports dpmigrate.runtime: converted before; left unchanged"


UNCHANGED_SUMMARY = "1 file, 0 changed, 0 changes, 0 declined, 0 errors"

PLAIN_SCRIPT = b'import json\n\n\ndef load(path):\n    with open(path) as f:\n        return json.load(f)\n'
BROKEN_TORCH = b"import torch\n\nx = torch.ones(\n"

RANK_DIVERGENT = b"import torch.distributed as dist\n\nif dist.get_rank() == 0:\n    dist.barrier()\n"


def rank_divergent_report(path: str) -> list[str]:
    return [
        f"{path}:1:1: note detect-framework: already uses torch.distributed / DistributedDataParallel / "
        "DistributedSampler: written for data parallelism by hand; left unchanged",
        f"{path}:4:5: error rank-divergent-code: dist.barrier is a collective every rank must reach, but it is "
        "under `if dist.get_rank() == 0:`: the other ranks never call it and the job hangs",
        "    fix: call it on every rank, outside the condition (compute the value on all ranks)",
        "1 file, 0 changed, 0 changes, 0 declined, 1 error",
    ]
