"""Every rank starts from rank 0's parameters, also those of a model no DDP wrapper owns.

Why: DDP broadcasts its module's parameters and buffers from rank 0 when it is built. A model the
codemod did not wrap (declined, or trained by a hand-written loop) reaches the runtime only through
``dp.distributed_optimizer``: its gradients are averaged, but each unseeded rank would keep its own
random initial weights, and the ranks would train N different models. So when
``distributed_optimizer`` wraps an optimizer on N > 1 ranks, every parameter it holds that no wrapped
model owns takes rank 0's value (``torch.distributed.broadcast``, once).

Buffers (what we do, exactly): an optimizer holds parameters only, so the modules are found among the
live objects (``gc.get_objects()``; every ``nn.Module`` is a garbage-collector-tracked object). A module
that holds one of those parameters *directly* (in its own ``_parameters``) has its own buffers
(``_buffers``: BatchNorm's running statistics, a registered random projection) broadcast from rank 0
too. Not covered: a module holding buffers but none of the optimizer's parameters directly (a
``BatchNorm(affine=False)``; torch's own layers build those buffers identically on every rank), and
buffers that drift apart during training (a model outside DDP keeps per-rank running statistics;
DDP's ``broadcast_buffers`` re-syncs only its own module before each forward). Two distinct modules of
one class holding the same parameters under the same names cannot be told apart across ranks: their
buffers are left alone rather than risk swapping them.

Every rank must issue the same broadcasts in the same order, and ``gc``'s order is not guaranteed to
agree between processes: tensors are ordered by the optimizer's parameter order (the same script
builds it identically on every rank), a module's buffers by the position of its first such parameter
and then by name. The ranks first compare the list of shapes and dtypes, so a rank that built a
different model fails with a message naming the difference instead of hanging in a broadcast.
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist


def broadcast_unowned_state(optimizer: torch.optim.Optimizer, owned: set[int]) -> None:
    """Rank 0's values into every parameter of ``optimizer`` whose id is not in ``owned``, and their modules' buffers."""
    parameters = _unique(p for g in optimizer.param_groups for p in g["params"] if id(p) not in owned)
    if not parameters:
        return
    tensors = parameters + _buffers_of_owners(parameters)
    _check_same_layout_on_every_rank(tensors, len(parameters))
    with torch.no_grad():
        for tensor in tensors:
            _broadcast_in_place(tensor.detach())


def _unique(tensors) -> list[torch.Tensor]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def _buffers_of_owners(parameters: list[torch.Tensor]) -> list[torch.Tensor]:
    position = {id(p): i for i, p in enumerate(parameters)}
    owners: dict[tuple, list[torch.nn.Module]] = {}
    gc.collect()  # a dropped module in a reference cycle must not count on one rank and not another
    for obj in gc.get_objects():
        if not issubclass(type(obj), torch.nn.Module):  # not isinstance: it would read proxies' __class__
            continue
        held = [(position[id(p)], name) for name, p in obj._parameters.items() if p is not None and id(p) in position]
        if held and obj._buffers:
            key = (min(held), tuple(sorted(held)), type(obj).__qualname__)
            owners.setdefault(key, []).append(obj)
    buffers = []
    for key in sorted(owners):
        modules = owners[key]
        if len(modules) > 1 and len({tuple(id(b) for b in m._buffers.values()) for m in modules}) > 1:
            continue  # indistinguishable across ranks (see the module docstring)
        buffers.extend(b for _, b in sorted(modules[0]._buffers.items()) if b is not None)
    return _unique(buffers)


def _check_same_layout_on_every_rank(tensors: list[torch.Tensor], parameter_count: int) -> None:
    layout = [(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in tensors]
    layouts: list = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, layout)
    reference = layouts[0]
    for rank, other in enumerate(layouts):
        if other == reference:
            continue
        first = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), min(len(other), len(reference)))
        kind = "parameter" if first < parameter_count else "buffer"
        raise RuntimeError(
            f"dp.distributed_optimizer: rank {rank} holds a different model than rank 0: {kind} #{first} "
            f"(in the optimizer's order) is {_describe(other, first)} on rank {rank} but "
            f"{_describe(reference, first)} on rank 0 "
            f"({len(other)} vs {len(reference)} parameters and buffers), so rank 0's starting values cannot be "
            "copied to it; build the same model and optimizer on every rank"
        )


def _describe(layout: list, index: int) -> str:
    return "missing" if index >= len(layout) else f"shape {layout[index][0]} {layout[index][1]}"


def _broadcast_in_place(tensor: torch.Tensor) -> None:
    if dist.get_backend() == "nccl" and tensor.device.type != "cuda":
        staged = tensor.to(torch.device("cuda", torch.cuda.current_device()))
        dist.broadcast(staged, src=0)
        tensor.copy_(staged)
    else:
        dist.broadcast(tensor, src=0)
