"""A Dataset that draws each sample at random, ignoring its index: the ranks draw their own samples, not the original's."""

from __future__ import annotations

import libcst as cst

from ...codemod.flow import method
from ...codemod.loaders import LoaderFlow
from ...codemod.rule import Rule
from ..common.shared_random_data import NUMPY_DRAWS, PYTHON_DRAWS

DATASETS = ("paddle.io.Dataset", "paddle.io.dataset.Dataset", "paddle.io.IterableDataset")
_SEEDS = {"numpy.random.seed": "numpy", "random.seed": "python", "paddle.seed": "paddle", "paddle.framework.seed": "paddle"}


class PaddleRandomSamples(Rule):
    """Note a ``paddle.io.Dataset`` whose ``__getitem__`` ignores its index and draws from a global generator.

    Why: ``np.random.seed(100)`` runs on every rank, and ``dp.init()`` gives every rank rank 0's state of Python's
    and NumPy's generators (``runtime/common.share_host_generators``): before training every rank would draw the same
    sequence, and the sampler's disjoint indices would not split anything, since ``__getitem__`` does not read them
    (issue 19). At the first pass over a sharded training loader the runtime parts the ranks' streams
    (``runtime/common.TrainingDraws``, issue 31): each rank then draws samples of its own, as N processes of the
    original would. Correct for a synthetic data
    set, but not the original's samples, which the note says, with the way to get them:
    Example (note):  np.random.seed(100)
                     class RandomDataset(paddle.io.Dataset):
                         def __getitem__(self, idx): return np.random.random([4]).astype("float32"), ...
    fix: draw each sample from its index (``rng = np.random.RandomState(idx)``), which every process draws alike.
    Paddle's own generator unseeded: each rank draws its own samples from the start: a note says so too. Where no
    loader the runtime shards starts training (``fit`` given the Dataset itself, a static program's file), the
    streams stay alike: the note says every rank draws the same samples, with the fix of seeding each rank apart.
    Leaves alone: the code (a note only); a ``__getitem__`` that reads its index (random augmentation of a real
    sample).
    """

    name = "paddle-random-samples"
    generations = ("dygraph", "static")

    def finish(self) -> None:
        calls = self.q.index.of_type(self.ctx.module, cst.Call)
        seeded = {family for c in calls for name, family in _SEEDS.items() if self.q.is_call_to(c, {name})}
        shared = {"numpy", "python"} - seeded  # unseeded, but shared by dp.init() (rank 0's state on every rank)
        # the runtime parts the ranks' streams at a sharded training loader's first pass (dygraph only), not in fit
        parted = self.ctx.generation == "dygraph" and bool(self.ctx.analysis(LoaderFlow).sharded_training())
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
            source = "that dp.init() gives every rank in rank 0's state" if family in shared else "the script seeds once"
            if not parted:  # nothing the runtime shards starts training: the streams stay alike on every rank
                self.report(draw, "note", f"{cls.name.value}.__getitem__ ignores `{index}` and draws each sample from "
                            f"a generator {source}: every rank draws the same sequence, so the ranks' disjoint indices "
                            "still give them the same samples (the data is not split, and N ranks add nothing)",
                            f"derive each sample from its index (rng = np.random.RandomState({index}); rng.random(...)),"
                            f" or seed each rank apart after the model is wrapped "
                            f"(np.random.seed(seed + {self.ctx.alias}.rank()))")
                continue
            self.report(
                draw, "note",
                f"{cls.name.value}.__getitem__ ignores `{index}` and draws each sample from a generator {source}"
                ": the ranks' disjoint indices do not decide what they read. The runtime gives each rank but 0 a "
                "random stream of its own at the first pass over a sharded training loader, so from there each "
                "rank draws its own samples, as N processes of the original "
                "would (a synthetic data set, statistically the same; rank 0 draws the original's), but no run of it "
                "can be compared with the original's sample by sample",
                f"to read the original's samples on N ranks, derive each sample from its index "
                f"(rng = np.random.RandomState({index}); rng.random(...))",
            )
