"""A Dataset that draws each sample at random from a generator seeded once: every rank draws the same samples."""

from __future__ import annotations

import libcst as cst

from ...codemod.flow import method
from ...codemod.rule import Rule
from ..common.shared_random_data import NUMPY_DRAWS, PYTHON_DRAWS

DATASETS = ("paddle.io.Dataset", "paddle.io.dataset.Dataset", "paddle.io.IterableDataset")
_SEEDS = {"numpy.random.seed": "numpy", "random.seed": "python", "paddle.seed": "paddle", "paddle.framework.seed": "paddle"}


class PaddleRandomSamples(Rule):
    """Note a ``paddle.io.Dataset`` whose ``__getitem__`` ignores its index and draws from a global generator.

    Why: ``np.random.seed(100)`` runs on every rank, so every rank draws the same sequence; the sampler gives the
    ranks disjoint indices, but ``__getitem__`` does not read them, so every rank trains on the same samples: the
    data split exists in name only, and nothing says so (issue 19). The fix is the script's to choose:
    Example (note):  np.random.seed(100)
                     class RandomDataset(paddle.io.Dataset):
                         def __getitem__(self, idx): return np.random.random([4]).astype("float32"), ...
    fix: draw each sample from its index (``rng = np.random.RandomState(idx)``), which every process draws alike,
    or seed each rank apart (``np.random.seed(100 + dp.rank())``).
    Python's and NumPy's generators are alike on every rank even unseeded: ``dp.init()`` gives every rank rank 0's
    state of them (``runtime/common.share_host_generators``), so the same note applies. Paddle's own generator
    unseeded: each rank draws its own samples, as N processes of the original would: a note says so too (correct
    for a synthetic data set, but not comparable with the original sample by sample).
    Leaves alone: the code (a note only); a ``__getitem__`` that reads its index (random augmentation of a real
    sample).
    """

    name = "paddle-random-samples"
    generations = ("dygraph", "static")

    def finish(self) -> None:
        calls = self.q.index.of_type(self.ctx.module, cst.Call)
        seeded = {family for c in calls for name, family in _SEEDS.items() if self.q.is_call_to(c, {name})}
        shared = {"numpy", "python"} - seeded  # unseeded, but shared by dp.init() (rank 0's state on every rank)
        draws_of = {"numpy": NUMPY_DRAWS, "python": PYTHON_DRAWS, "paddle": self.vocabulary.random_draws}
        for cls in self.q.index.of_type(self.ctx.module, cst.ClassDef):
            if not any(self.q.qualified_names(base.value) & set(DATASETS) for base in cls.bases):
                continue
            getitem = method(cls, "__getitem__")
            if getitem is None or len(getitem.params.params) < 2:
                continue
            index = getitem.params.params[1].name.value
            if index in self.q.names_in(getitem.body):
                continue  # the sample depends on its index: random augmentation of a real sample
            draws = [(c, family) for c in self.q.index.of_type(getitem, cst.Call)
                     for family in draws_of if self.q.is_call_to(c, draws_of[family])]
            if not draws:
                continue
            draw, family = next(((c, f) for c, f in draws if f in seeded | shared), draws[0])
            if family not in seeded | shared:
                self.report(draw, "note", f"{cls.name.value}.__getitem__ ignores `{index}` and draws each sample at "
                            "random, unseeded: each rank draws its own samples, as N processes of the original would "
                            "(a synthetic data set, statistically the same), but no run of it can be compared with the "
                            "original's sample by sample (dpmigrate verify reports inputs-differ)",
                            f"to compare runs, derive each sample from its index: rng = np.random.RandomState({index})")
                continue
            self.report(
                draw, "note",
                f"{cls.name.value}.__getitem__ ignores `{index}` and draws each sample from a generator "
                + ("that dp.init() gives every rank in rank 0's state" if family in shared else "the script seeds once")
                + ": every rank draws the same sequence, so the ranks' disjoint indices still give them the "
                "same samples (the data is not split, and N ranks add nothing)",
                f"derive each sample from its index (rng = np.random.RandomState({index}); rng.random(...)), or seed "
                f"each rank apart after the model is wrapped (np.random.seed(seed + {self.ctx.alias}.rank()))",
            )
