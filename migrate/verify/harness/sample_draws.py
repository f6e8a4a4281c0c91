"""Random draws a library augmentation makes for one sample, keyed by that sample's index: the same in both runs.

Why: augmentation (``paddle.vision.transforms``: a random flip or crop in ``__getitem__``) draws from Python's and
NumPy's global generators. The original draws them for the samples of its batch in one order, each rank for its
own share in another, so rank 1's flips were never the original's: verify said "inputs-differ" for a conversion
that was correct (an issue 19 audit script with ``RandomHorizontalFlip`` and ``RandomCrop``). So while a
DataLoader fetches sample ``i`` (its map-style fetcher, in the main process, Paddle's reading thread or a worker)
and a library transform runs (``BaseTransform.__call__``), Python's ``random`` and NumPy's ``np.random`` functions
draw from generators seeded by ``i`` alone: sample ``i`` is augmented alike wherever it lands, and the global
streams do not advance.

Only a library's transforms: draws the script's own ``__getitem__`` makes stay as they are, so a Dataset that
ignores its index and draws its samples from a generator seeded alike on every rank (every rank then reads the
same samples: ``fixtures/paddle/random_samples_seeded``) is still seen as not sharded. torchvision's transforms
draw from torch's generator and are not keyed (not installed here to test them).

Python's and NumPy's module functions are replaced by dispatchers (a thread-local generator inside a transform, the
module's own otherwise): Paddle reads batches in a thread while the main thread trains, so saving and restoring
the global state there would race. ``seed``, ``get_state`` and ``set_state`` stay as they are.
A sample's draws are the same every epoch in both runs: a change of the run's, like shuffling off.
"""

from __future__ import annotations

import functools
import random
import sys
import threading
import zlib

SAMPLE_SEED = 20261126
_PYTHON_FUNCTIONS = ("random", "uniform", "randint", "randrange", "choice", "choices", "shuffle", "sample",
                     "gauss", "normalvariate", "triangular", "betavariate", "expovariate", "gammavariate",
                     "lognormvariate", "vonmisesvariate", "paretovariate", "weibullvariate", "getrandbits",
                     "randbytes", "binomialvariate")
_NUMPY_KEPT = ("seed", "get_state", "set_state", "RandomState", "Generator", "default_rng", "get_bit_generator",
               "set_bit_generator")


class _Keyed(threading.local):
    """This thread's keyed generators while it fetches a sample (None otherwise), whether a library transform is
    running (only then do the dispatchers use them), and whether any was drawn from."""

    python: random.Random | None = None
    numpy = None
    transforms = 0
    drew = False


_keyed = _Keyed()


def install(recorder) -> None:
    """At activation: Python's ``random`` functions dispatch (NumPy's and the fetchers follow on import)."""
    for name in _PYTHON_FUNCTIONS:
        own = getattr(random, name, None)
        if own is not None:
            setattr(random, name, _dispatching(name, own, "python"))


def numpy_ready(np) -> None:
    generator = np.random.mtrand._rand
    for name in dir(generator):
        own = getattr(np.random, name, None)
        if name.startswith("_") or name in _NUMPY_KEPT or getattr(own, "__self__", None) is not generator:
            continue
        setattr(np.random, name, _dispatching(name, own, "numpy"))


def _dispatching(name: str, own, which: str):
    @functools.wraps(own)
    def draw(*args, **kwargs):
        keyed = getattr(_keyed, which) if _keyed.transforms else None
        if keyed is None:
            return own(*args, **kwargs)
        _keyed.drew = True
        return getattr(keyed, name)(*args, **kwargs)
    return draw


def key_paddle_fetches(fetch_module, recorder) -> None:
    """``paddle.io.dataloader.fetcher``: a map-style fetch of sample ``i`` holds generators seeded by ``i``."""
    original = fetch_module._MapDatasetFetcher.fetch

    @functools.wraps(original)
    def fetch(self, *args, **kwargs):
        if not isinstance(self.dataset, _KeyedDataset):
            self.dataset = _KeyedDataset(self.dataset, recorder)
        return original(self, *args, **kwargs)

    fetch_module._MapDatasetFetcher.fetch = fetch


def key_paddle_transforms(transforms_module, recorder) -> None:
    """``paddle.vision.transforms.transforms``: every transform (``BaseTransform.__call__``, which the random ones
    all go through) draws from the sample's generators while a sample is fetched."""
    base = transforms_module.BaseTransform
    original = base.__call__

    @functools.wraps(original)
    def call(self, *args, **kwargs):
        _keyed.transforms += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _keyed.transforms -= 1

    base.__call__ = call


class _KeyedDataset:
    """The script's map-style dataset, each ``[index]`` holding generators seeded by that index for the library
    transforms it runs. Attributes are the dataset's."""

    def __init__(self, dataset, recorder):
        self._dataset, self._recorder = dataset, recorder

    def __getattr__(self, name):
        return getattr(self._dataset, name)

    def __len__(self):
        return len(self._dataset)

    def __getitem__(self, index):
        seed = _seed_of(index)
        numpy = sys.modules.get("numpy")
        _keyed.python = random.Random(seed)
        _keyed.numpy = numpy.random.RandomState(seed) if numpy is not None else None
        _keyed.drew = False
        try:
            return self._dataset[index]
        finally:
            _keyed.python = _keyed.numpy = None
            if _keyed.drew:
                self._recorder.changed("augmentation keyed by the sample's index (paddle.vision transforms: alike "
                                       "in both runs)")


def _seed_of(index) -> int:
    """The same for an index in every process and every run (``hash`` of a str varies between processes)."""
    key = index if isinstance(index, int) else zlib.crc32(repr(index).encode())
    return (SAMPLE_SEED * 1_000_003 + int(key)) % 2**32
