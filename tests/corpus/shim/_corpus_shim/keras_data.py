"""Synthetic ``keras.datasets`` (Keras 3: ``keras`` and ``tf.keras``) and ``tf_keras.datasets`` (Keras 2), and an
offline ``get_file``.

Why the ``load_data`` functions are replaced rather than the files they download: Keras's CIFAR loaders fill
arrays of the real 50,000 samples, so only a whole-size fake archive would do, and the runs must stay small. The
replacements return what the real ones do (tuples of numpy arrays, the same dtypes and shapes but for the count,
``channels_first`` honoured, IMDB's and Reuters' ``num_words``/``skip_top``/``maxlen``/``start_char``/
``oov_char``/``index_from`` applied as Keras applies them). ``get_file`` never downloads: it makes the few files
scripts fetch themselves that can be made (``mnist.npz``, ``shakespeare.txt``, ``nietzsche.txt``) and refuses
everything else naming the shim, so a corpus run says why it stopped instead of timing out on the network.
"""

from __future__ import annotations

import functools
import os
import types
from urllib.parse import urlparse

import numpy as np

from . import synth

SHIM = "dpmigrate corpus shim"


def _replace(module, attr: str, function) -> None:
    """``module.attr = function`` under the original's name and docstring (a copy: Keras 2 and 3 share the functions)."""
    old = getattr(module, attr, None)
    if old is None:
        return
    new = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                             function.__closure__)
    new.__kwdefaults__ = function.__kwdefaults__
    functools.update_wrapper(new, old, assigned=("__name__", "__qualname__", "__doc__"), updated=())
    new.dpmigrate_corpus_shim = True
    setattr(module, attr, new)


def _images(name: str, shape: tuple[int, ...], num_classes: int, real: tuple[int, int]):
    n_train, n_test = synth.counts(*real)
    return synth.images(name, "train", n_train, shape, num_classes), synth.images(name, "test", n_test, shape, num_classes)


def _mnist_like(name: str):
    def load_data(*_args, **_kwargs):
        (x_train, y_train), (x_test, y_test) = _images(name, (28, 28), 10, (60000, 10000))
        return (x_train, y_train.astype(np.uint8)), (x_test, y_test.astype(np.uint8))

    return load_data


def _channels(module, x: np.ndarray) -> np.ndarray:
    backend = getattr(module, "backend", None)
    if backend is not None and backend.image_data_format() == "channels_first":
        return x.transpose(0, 3, 1, 2)
    return x


def _cifar10(module):
    def load_data(*_args, **_kwargs):
        (x_train, y_train), (x_test, y_test) = _images("cifar10", (32, 32, 3), 10, (50000, 10000))
        return ((_channels(module, x_train), y_train.astype(np.uint8).reshape(-1, 1)),
                (_channels(module, x_test), y_test.astype(np.uint8).reshape(-1, 1)))

    return load_data


def _cifar100(module):
    def load_data(label_mode="fine", *_args, **_kwargs):
        if label_mode not in ("fine", "coarse"):
            raise ValueError(f'`label_mode` must be one of `"fine"`, `"coarse"`. Received: label_mode={label_mode}.')
        (x_train, y_train), (x_test, y_test) = _images("cifar100", (32, 32, 3), 100, (50000, 10000))
        if label_mode == "coarse":  # 20 superclasses of 5 classes each
            y_train, y_test = y_train // 5, y_test // 5
        return (_channels(module, x_train), y_train.reshape(-1, 1)), (_channels(module, x_test), y_test.reshape(-1, 1))

    return load_data


def _index(docs, labels, maxlen, start_char, index_from):
    """Keras's first steps: mark the start, shift the ranks by ``index_from``, drop sequences of ``maxlen`` or more."""
    if start_char is not None:
        xs = [[start_char] + [w + index_from for w in x] for x in docs]
    elif index_from:
        xs = [[w + index_from for w in x] for x in docs]
    else:
        xs = [list(x) for x in docs]
    ys = [int(y) for y in labels]
    if maxlen:
        kept = [(x, y) for x, y in zip(xs, ys) if len(x) < maxlen]
        xs, ys = [x for x, _ in kept], [y for _, y in kept]
    return xs, ys


def _vocabulary(xs, num_words, skip_top, oov_char):
    """Keras's last step: words outside ``skip_top <= w < num_words`` become ``oov_char`` (or go)."""
    if not num_words:
        num_words = max(max(x) for x in xs)
    if oov_char is not None:
        return [[w if skip_top <= w < num_words else oov_char for w in x] for x in xs]
    return [[w for w in x if skip_top <= w < num_words] for x in xs]


IMDB_VOCAB, REUTERS_VOCAB = 88584, 30979


def _imdb_load_data(path="imdb.npz", num_words=None, skip_top=0, maxlen=None, seed=113, start_char=1, oov_char=2,
                    index_from=3, **_kwargs):
    n_train, n_test = synth.counts(25000, 25000)
    x_train, y_train = _index(*synth.sequences("imdb", "train", n_train, IMDB_VOCAB, 2), maxlen, start_char, index_from)
    x_test, y_test = _index(*synth.sequences("imdb", "test", n_test, IMDB_VOCAB, 2), maxlen, start_char, index_from)
    if maxlen and (not x_train or not x_test):
        raise ValueError(f"After filtering for sequences shorter than maxlen={maxlen}, no sequence was kept. Increase maxlen.")
    xs = _vocabulary(x_train + x_test, num_words, skip_top, oov_char)
    labels = np.array(y_train + y_test, dtype=np.int64)
    idx = len(x_train)
    return (np.array(xs[:idx], dtype="object"), labels[:idx]), (np.array(xs[idx:], dtype="object"), labels[idx:])


def _reuters_load_data(path="reuters.npz", num_words=None, skip_top=0, maxlen=None, test_split=0.2, seed=113,
                       start_char=1, oov_char=2, index_from=3, **_kwargs):
    docs, labels = synth.sequences("reuters", "all", synth.total(11228), REUTERS_VOCAB, 46, (10, 250))
    xs, ys = _index(docs, labels, maxlen, start_char, index_from)
    xs = _vocabulary(xs, num_words, skip_top, oov_char)
    idx = int(len(xs) * (1 - test_split))
    return (np.array(xs[:idx], dtype="object"), np.array(ys[:idx])), (np.array(xs[idx:], dtype="object"), np.array(ys[idx:]))


def _word_index(vocab: int):
    def get_word_index(*_args, **_kwargs):
        return {f"w{i}": i for i in range(1, vocab + 1)}

    return get_word_index


def _check_split(test_split) -> None:
    if not 0 <= test_split < 1:
        raise ValueError(f"Invalid `test_split` argument: {test_split}. It must be between 0 and 1 (exclusive of 1).")


def _split(x, y, test_split):
    cut = int(len(x) * (1 - test_split))
    return (np.array(x[:cut]), np.array(y[:cut])), (np.array(x[cut:]), np.array(y[cut:]))


def _boston_load_data(path="boston_housing.npz", test_split=0.2, seed=113, **_kwargs):
    _check_split(test_split)
    table = synth.housing("boston_housing", synth.total(506))
    return _split(table[:, :13], table[:, 13], test_split)


def _california_load_data(version="large", path="california_housing.npz", test_split=0.2, seed=113, **_kwargs):
    _check_split(test_split)
    if version not in ("small", "large"):
        raise ValueError(f"Argument `version` must be one of 'small', 'large'. Received: version={version}")
    x, y = synth.california("california_housing", synth.total(20640))
    if version == "small":
        x, y = x[:600], y[:600]
    return _split(x, y, test_split)


def _write_mnist(f) -> None:
    (x_train, y_train), (x_test, y_test) = _mnist_like("mnist")()
    np.savez(f, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def _writer_text(name: str):
    def write(f) -> None:
        f.write(synth.text(name, max(10000, 101 * synth.samples())).encode())

    return write


# files scripts fetch with get_file themselves, by the name in their origin
FAKE_FILES = {
    "mnist.npz": _write_mnist, "shakespeare.txt": _writer_text("shakespeare"), "nietzsche.txt": _writer_text("nietzsche"),
}


def _get_file(original):
    def get_file(fname=None, origin=None, *args, **kwargs):
        if origin is not None and str(origin).startswith("file:"):  # a local file: nothing to download
            return original(fname, origin, *args, **kwargs)
        names = [os.path.basename(urlparse(str(origin)).path)] if origin else []
        names += [os.path.basename(str(fname))] if fname else []
        for name in names:
            if name in FAKE_FILES:
                return synth.write_once(os.path.join(synth.cache_dir(), name), FAKE_FILES[name])
        raise RuntimeError(f"{SHIM}: cannot fake get_file({origin or fname}): no network here, and no synthetic stand-in for it")

    return get_file


def _datasets(prefix: str) -> dict:
    def patch(attr, make):
        return lambda module: _replace(module, attr, make(module))

    hooks = {
        "mnist": [patch("load_data", lambda m: _mnist_like("mnist"))],
        "fashion_mnist": [patch("load_data", lambda m: _mnist_like("fashion_mnist"))],
        "cifar10": [patch("load_data", _cifar10)],
        "cifar100": [patch("load_data", _cifar100)],
        "imdb": [patch("load_data", lambda m: _imdb_load_data), patch("get_word_index", lambda m: _word_index(IMDB_VOCAB))],
        "reuters": [patch("load_data", lambda m: _reuters_load_data),
                    patch("get_word_index", lambda m: _word_index(REUTERS_VOCAB))],
        "boston_housing": [patch("load_data", lambda m: _boston_load_data)],
        "california_housing": [patch("load_data", lambda m: _california_load_data)],
    }
    return {f"{prefix}.{name}": (lambda module, fs=fs: [f(module) for f in fs]) for name, fs in hooks.items()}


def _patch_get_file(module) -> None:
    _replace(module, "get_file", _get_file(module.get_file))


HOOKS = {
    **_datasets("keras.src.datasets"),  # Keras 3, which tf.keras is in TensorFlow 2.16 and later
    **_datasets("tf_keras.src.datasets"),  # Keras 2 (tf-keras; tf.keras under TF_USE_LEGACY_KERAS=1)
    "keras.src.utils.file_utils": _patch_get_file,
    "tf_keras.src.utils.data_utils": _patch_get_file,
}
