"""Deterministic synthetic data: the same bytes in every process, whatever ran before.

Why: ``dpmigrate verify`` compares the original (one process) with its conversion (every rank) step by step, so
each process must read exactly the same data. Every generator here is a private ``numpy.random.Generator`` seeded
from the data set's name and split, never from (and never touching) the global state of numpy, ``random``, torch,
Paddle or TensorFlow. Images carry a per-class template under the noise, and sequences a few per-class words, so
a model can learn something and losses move as they would on real data.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np

SAMPLES_ENV = "DPMIGRATE_CORPUS_SAMPLES"
DEFAULT_SAMPLES = 512


def samples() -> int:
    """Training samples per data set (``DPMIGRATE_CORPUS_SAMPLES``, default 512): small, so runs are quick."""
    raw = os.environ.get(SAMPLES_ENV, "").strip()
    if not raw:
        return DEFAULT_SAMPLES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"dpmigrate corpus shim: {SAMPLES_ENV}={raw!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"dpmigrate corpus shim: {SAMPLES_ENV}={raw!r} must be at least 1")
    return value


def counts(real_train: int, real_test: int) -> tuple[int, int]:
    """How many training and test samples to make: the knob's, a quarter of it for test, never more than the real set."""
    n = samples()
    return min(real_train, n), min(real_test, max(1, n // 4))


def total(real_total: int) -> int:
    """For data sets split by the loader (``test_split``): about the knob's count for training once split 80/20."""
    n = samples()
    return min(real_total, n + max(1, n // 4))


def rng(name: str, split: str) -> np.random.Generator:
    """A private generator whose stream depends on nothing but ``name`` and ``split``."""
    digest = hashlib.sha256(f"dpmigrate-corpus-shim/{name}/{split}".encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


def labels(name: str, split: str, n: int, num_classes: int) -> np.ndarray:
    """``n`` int64 labels, every class as often as the others (as in the real sets), in a fixed shuffled order."""
    return rng(name, split + "/labels").permutation(np.arange(n, dtype=np.int64) % num_classes)


def images(name: str, split: str, n: int, shape: tuple[int, ...], num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: ``n`` uint8 images of ``shape`` (values 0..255) and their int64 labels.

    Each image is 3/5 its class's template (the same in every split, so what is learnt on train holds on test) and
    2/5 noise of its own.
    """
    y = labels(name, split, n, num_classes)
    templates = rng(name, "templates").integers(0, 256, (num_classes, *shape), dtype=np.uint8)
    noise = rng(name, split + "/images").integers(0, 256, (n, *shape), dtype=np.uint8)
    x = (templates[y].astype(np.uint16) * 3 + noise.astype(np.uint16) * 2) // 5
    return x.astype(np.uint8), y


def sequences(
    name: str, split: str, n: int, vocab: int, num_classes: int, lengths: tuple[int, int] = (20, 300)
) -> tuple[list[list[int]], np.ndarray]:
    """``(docs, y)``: ``n`` lists of word ranks in ``1..vocab`` (frequent words often, as in text), int64 labels.

    One word in ten is drawn from a band of 20 words that belongs to the document's class.
    """
    y = labels(name, split, n, num_classes)
    r = rng(name, split + "/words")
    sizes = r.integers(lengths[0], lengths[1] + 1, n)
    words = (r.zipf(1.3, int(sizes.sum())) - 1) % vocab + 1
    owner = np.repeat(y, sizes)
    signal = r.random(words.size) < 0.1
    band = 10 + 20 * owner + r.integers(0, 20, words.size)
    words = np.where(signal, np.minimum(band, vocab), words)
    return [part.tolist() for part in np.split(words, np.cumsum(sizes)[:-1])], y


def housing(name: str, n: int) -> np.ndarray:
    """``n`` rows of the Boston housing table's 13 features and its target (float64, plausible magnitudes)."""
    r = rng(name, "all")
    scale = np.array([3.6, 11.4, 11.1, 0.07, 0.55, 6.3, 68.6, 3.8, 9.5, 408.0, 18.5, 356.0, 12.7])
    x = np.abs(r.normal(1.0, 0.35, (n, 13))) * scale
    x[:, 3] = (r.random(n) < 0.07).astype(np.float64)  # CHAS: a 0/1 flag
    y = np.clip(22.5 + 6.0 * (x[:, 5] - 6.3) - 0.5 * (x[:, 12] - 12.7) + r.normal(0, 3.0, n), 5.0, 50.0)
    return np.column_stack([x, y])


def california(name: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: California housing's 8 features and house values in dollars (float32)."""
    r = rng(name, "all")
    x = np.column_stack([
        r.uniform(-124.3, -114.3, n), r.uniform(32.5, 42.0, n), r.integers(1, 53, n), r.uniform(100, 6000, n),
        r.uniform(20, 1200, n), r.uniform(50, 3500, n), r.uniform(20, 1100, n), r.uniform(0.5, 15.0, n),
    ])
    y = np.clip(15000 + 40000 * x[:, 7] + r.normal(0, 30000, n), 14999, 500001)
    return x.astype(np.float32), y.astype(np.float32)


_WORDS = (
    "the of and to in a that is was he for it with as his on be at by had not are but from or have an they which "
    "one you were her all she there would their we him been has when who will more no if out so said what up its "
    "about into than them can only other new some time could these two may then do first any my now such like our "
    "over man me even most made after also did many before must through back years where much your way well down"
).split()


def text(name: str, n_chars: int) -> str:
    """About ``n_chars`` characters of English-looking prose: lines of sentences made of frequent words."""
    r = rng(name, "text")
    out: list[str] = []
    size = 0
    while size < n_chars:
        sentence = " ".join(_WORDS[i] for i in r.integers(0, len(_WORDS), int(r.integers(4, 14)))).capitalize()
        line = sentence + (".\n" if r.random() < 0.3 else ". ")
        out.append(line)
        size += len(line)
    return "".join(out)


def cache_dir() -> str:
    """Where synthetic stand-in files are written (one folder per sample count)."""
    base = os.environ.get("DPMIGRATE_CORPUS_CACHE") or os.path.join(tempfile.gettempdir(), "dpmigrate-corpus-shim")
    path = os.path.join(base, f"samples-{samples()}")
    os.makedirs(path, exist_ok=True)
    return path


def write_once(path: str, write) -> str:
    """Make ``path`` with ``write(binary_file)`` unless it is there; atomic, so ranks writing at once all read it whole."""
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    return path
