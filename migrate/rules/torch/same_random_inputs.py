"""Random inputs drawn inside training after a seed every rank shares: alike on every rank, or each rank's own once a
sharded loader feeds the loop."""

from __future__ import annotations

import libcst as cst

from ...codemod.loaders import LoaderFlow
from ...codemod.rule import Rule

_SEEDS = {"torch.manual_seed", "torch.random.manual_seed", "random.seed", "numpy.random.seed"}
_DRAWS = {"torch.randn", "torch.rand", "torch.randint", "torch.randn_like", "torch.rand_like", "torch.normal",
          "torch.randperm", "torch.bernoulli", "torch.multinomial"}
_IN_PLACE = {"normal_", "uniform_", "bernoulli_", "random_", "exponential_"}


class SameRandomInputs(Rule):
    """Note random inputs a training loop draws after a fixed seed (a GAN's noise, augmentation noise).

    Why: every rank runs ``torch.manual_seed(seed)``, so every rank's generator is alike. In a loop that reads a
    sharded training loader, the runtime gives every rank but 0 a stream of its own at the loader's first pass
    (``runtime/common.TrainingDraws``): a GAN's generator then sees N x B different noise vectors per step, as the
    global batch promises, rank 0 drawing the original's; the note says so, and why one process's run cannot be
    matched number for number (``dpmigrate verify`` reports random-draws, a difference, not a fault). In any other
    training loop (hand-cut batches every rank reads whole) the streams stay alike, so every rank draws the same
    numbers: training is still correct, it just gains less, and the note gives the fix.
    Example (note):  torch.manual_seed(opt.manualSeed)
                     ... for data in loader: noise = torch.randn(b, nz, 1, 1)
    fix (a loop no sharded loader feeds): after the models are wrapped (DDP has then copied rank 0's weights), seed
    each rank apart: ``torch.manual_seed(seed + dp.rank())``.
    Leaves alone: the code (a note only), and scripts that never seed (ranks then draw apart).
    """

    name = "same-random-inputs"

    def finish(self) -> None:
        calls = self.q.index.of_type(self.ctx.module, cst.Call)
        if not any(self.q.is_call_to(c, _SEEDS) for c in calls):
            return
        sharded_loops = {id(loop.node) for loader in self.ctx.analysis(LoaderFlow).sharded_training()
                         for loop in loader.loops}
        for call in calls:
            if not (self.q.is_call_to(call, _DRAWS) or self._in_place_draw(call)):
                continue
            loop = next((a for a in self.q.ancestors(call) if isinstance(a, (cst.For, cst.While))), None)
            if loop is None or not self.q.trains(loop.body):
                continue
            if any(id(a) in sharded_loops for a in self.q.ancestors(call)):
                self.report(
                    call, "note",
                    "random inputs drawn in the training loop after a fixed seed: at the sharded loader's first pass "
                    "the runtime gives each rank but 0 a random stream of its own, so each rank draws its own "
                    "numbers (rank 0 the original's), as N processes would; one process's run cannot be matched "
                    "number for number",
                )
            else:
                self.report(
                    call, "note",
                    "random inputs drawn in the training loop after a fixed seed: every rank draws the same numbers, "
                    "so these inputs are identical on every rank (N ranks add no variety to them)",
                    "after the models are wrapped, seed each rank apart: torch.manual_seed(seed + dp.rank())",
                )
            return  # once per file

    def _in_place_draw(self, call: cst.Call) -> bool:
        return isinstance(call.func, cst.Attribute) and call.func.attr.value in _IN_PLACE
