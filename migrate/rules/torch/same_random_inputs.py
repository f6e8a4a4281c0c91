"""Random inputs drawn inside training from a seed every rank shares: identical on every rank."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule

_SEEDS = {"torch.manual_seed", "torch.random.manual_seed", "random.seed", "numpy.random.seed"}
_DRAWS = {"torch.randn", "torch.rand", "torch.randint", "torch.randn_like", "torch.rand_like", "torch.normal",
          "torch.randperm", "torch.bernoulli", "torch.multinomial"}
_IN_PLACE = {"normal_", "uniform_", "bernoulli_", "random_", "exponential_"}


class SameRandomInputs(Rule):
    """Note random inputs a training loop draws after a fixed seed (a GAN's noise, augmentation noise).

    Why: every rank runs ``torch.manual_seed(seed)``, so every rank draws the same numbers: a GAN's
    generator sees the same B noise vectors on N ranks instead of N x B different ones, while the
    report says the global batch is N x B. Training is still correct, it just gains less.
    Example (note):  torch.manual_seed(opt.manualSeed)
                     ... for data in loader: noise = torch.randn(b, nz, 1, 1)
    fix: after the models are wrapped (DDP has then copied rank 0's weights), seed each rank apart:
    ``torch.manual_seed(seed + dp.rank())``.
    Leaves alone: the code (a note only), and scripts that never seed (ranks then draw apart).
    """

    name = "same-random-inputs"

    def finish(self) -> None:
        calls = self.q.index.of_type(self.ctx.module, cst.Call)
        if not any(self.q.is_call_to(c, _SEEDS) for c in calls):
            return
        for call in calls:
            if not (self.q.is_call_to(call, _DRAWS) or self._in_place_draw(call)):
                continue
            loop = next((a for a in self.q.ancestors(call) if isinstance(a, (cst.For, cst.While))), None)
            if loop is not None and self.q.trains(loop.body):
                self.report(
                    call, "note",
                    "random inputs drawn in the training loop after a fixed seed: every rank draws the same numbers, "
                    "so these inputs are identical on every rank (N ranks add no variety to them)",
                    "after the models are wrapped, seed each rank apart: torch.manual_seed(seed + dp.rank())",
                )
                return  # once per file: the fix is one line

    def _in_place_draw(self, call: cst.Call) -> bool:
        return isinstance(call.func, cst.Attribute) and call.func.attr.value in _IN_PLACE
