"""Random draws a Dataset makes for one sample, keyed by that sample's index: the same in both runs.

Why: augmentation (a random flip or crop in ``__getitem__``, ``paddle.vision.transforms``, torchvision) and
noise drawn per sample come from the global generators. The original draws them for the samples of its batch
in one order, each rank for its own share in another, so rank 1's flips were never the original's: verify said
"inputs-differ" for a conversion that was correct (an audit script with ``RandomHorizontalFlip`` and
``RandomCrop``). Turning every augmentation off would need a switch per transform of every library; keying the
draws does not: while a DataLoader fetches sample ``i`` (its map-style fetcher, in the main process, Paddle's
reading thread or a worker), Python's ``random`` and NumPy's ``np.random`` functions draw from generators
seeded by ``i`` alone, and torch's global generator is seeded by ``i`` and then restored. Sample ``i`` is then
augmented alike wherever it lands, on every rank and in the single process, and the global streams do not
advance (so the harness does not mistake augmentation for random draws in training).

Python's and NumPy's module functions are replaced by dispatchers (a thread-local generator while a sample is
fetched, the module's own otherwise): Paddle reads batches in a thread while the main thread trains, so saving
and restoring the global state there would race. ``seed``, ``get_state`` and ``set_state`` stay as they are.
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
    """This thread's generators while it fetches a sample (None otherwise), and whether any was drawn from."""

    python: random.Random | None = None
    numpy = None
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
        keyed = getattr(_keyed, which)
        if keyed is None:
            return own(*args, **kwargs)
        _keyed.drew = True
        return getattr(keyed, name)(*args, **kwargs)
    return draw


def key_torch_fetches(fetch_module, recorder) -> None:
    """``torch.utils.data._utils.fetch``: map-style fetches key their samples' draws (torch's generator too)."""
    _key_fetches(fetch_module._MapDatasetFetcher, recorder, torch=sys.modules.get("torch"))


def key_paddle_fetches(fetch_module, recorder) -> None:
    """``paddle.io.dataloader.fetcher``: the same for Paddle (its transforms draw from ``random`` and NumPy)."""
    _key_fetches(fetch_module._MapDatasetFetcher, recorder, torch=None)


def _key_fetches(fetcher_class, recorder, torch) -> None:
    original = fetcher_class.fetch

    @functools.wraps(original)
    def fetch(self, *args, **kwargs):
        if not isinstance(self.dataset, _KeyedDataset):
            self.dataset = _KeyedDataset(self.dataset, recorder, torch)
        return original(self, *args, **kwargs)

    fetcher_class.fetch = fetch


class _KeyedDataset:
    """The script's map-style dataset, each ``[index]`` drawing from generators seeded by that index.

    Attributes are the dataset's; ``__getitems__`` is not offered, so torch's fetcher asks sample by sample.
    """

    def __init__(self, dataset, recorder, torch):
        self._dataset, self._recorder, self._torch = dataset, recorder, torch

    def __getattr__(self, name):
        if name == "__getitems__":
            raise AttributeError(name)
        return getattr(self._dataset, name)

    def __len__(self):
        return len(self._dataset)

    def __getitem__(self, index):
        seed = _seed_of(index)
        numpy = sys.modules.get("numpy")
        _keyed.python = random.Random(seed)
        _keyed.numpy = numpy.random.RandomState(seed) if numpy is not None else None
        _keyed.drew = False
        torch_state = self._torch_seeded(seed)
        try:
            return self._dataset[index]
        finally:
            drew = _keyed.drew
            _keyed.python = _keyed.numpy = None
            if torch_state is not None:
                drew = drew or not self._torch.equal(self._torch.random.get_rng_state(), self._seeded_state)
                self._torch.random.set_rng_state(torch_state)
            if drew:
                self._recorder.changed("random draws per sample keyed by its index (augmentation alike in both runs)")

    def _torch_seeded(self, seed: int):
        """torch's generator seeded for this sample, its state to restore (None without torch)."""
        if self._torch is None:
            return None
        saved = self._torch.random.get_rng_state()
        self._torch.manual_seed(seed)
        self._seeded_state = self._torch.random.get_rng_state()
        return saved


def _seed_of(index) -> int:
    """The same for an index in every process and every run (``hash`` of a str varies between processes)."""
    key = index if isinstance(index, int) else zlib.crc32(repr(index).encode())
    return (SAMPLE_SEED * 1_000_003 + int(key)) % 2**32
