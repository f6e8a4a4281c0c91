"""Synthetic ``paddle.vision.datasets`` (MNIST, FashionMNIST, Cifar10, Cifar100) and ``paddle.text.datasets`` (Imdb,
UCIHousing).

Why this shape: each of these modules fetches its file through its own ``_check_exists_and_download``. The shim's
stand-in returns a path given that exists (a file the script names is read as usual) and otherwise a ``Synthetic``
path instead of downloading; the class's parsing method (``_parse_dataset``, ``_load_data``, ...) sees that mark
and fills the same attributes with synthetic values of the real layout. The real ``__init__``, ``__getitem__``
(``mode``, ``transform``, the ``cv2``/``pil`` backend, the label as an int64 array ``[label]``) and ``__len__``
then run unchanged.
"""

from __future__ import annotations

import os

import numpy as np

from . import synth


class Synthetic(str):
    """The path of a file that was not downloaded: the data is made up when the data set parses it."""


def _check_exists_and_download(path, url, md5, module_name, download=True):
    if path and os.path.exists(path):
        return path
    return Synthetic(f"<dpmigrate corpus shim: synthetic {module_name}>")


def _images(name: str, mode: str, real: tuple[int, int], shape, num_classes: int):
    n_train, n_test = synth.counts(*real)
    return synth.images(name, mode, n_train if mode == "train" else n_test, shape, num_classes)


def _mark(cls) -> None:
    cls.dpmigrate_corpus_shim = True


def patch_mnist(module) -> None:
    module._check_exists_and_download = _check_exists_and_download
    parse = module.MNIST._parse_dataset

    def _parse_dataset(self, buffer_size=100):
        if not isinstance(self.image_path, Synthetic) and not isinstance(self.label_path, Synthetic):
            return parse(self, buffer_size)
        name = "fashion_mnist" if isinstance(self, module.FashionMNIST) else "mnist"
        x, y = _images(name, self.mode, (60000, 10000), (28, 28), 10)
        self.images = list(x.reshape(len(x), 28 * 28).astype(np.float32))  # as parsed: float32 rows of 784
        self.labels = [np.array([label]).astype("int64") for label in y.tolist()]

    module.MNIST._parse_dataset = _parse_dataset
    _mark(module.MNIST)


def patch_cifar(module) -> None:
    module._check_exists_and_download = _check_exists_and_download
    load = module.Cifar10._load_data

    def _load_data(self):
        if not isinstance(self.data_file, Synthetic):
            return load(self)
        hundred = isinstance(self, module.Cifar100)
        x, y = _images("cifar100" if hundred else "cifar10", self.mode, (50000, 10000), (32, 32, 3), 100 if hundred else 10)
        rows = x.transpose(0, 3, 1, 2).reshape(len(x), 3 * 32 * 32)  # as pickled: CHW rows of uint8
        self.data = list(zip(rows, y.tolist()))

    module.Cifar10._load_data = _load_data
    _mark(module.Cifar10)


IMDB_VOCAB = 5147  # the real dictionary's size at the default cutoff (150)


def patch_imdb(module) -> None:
    module._check_exists_and_download = _check_exists_and_download
    Imdb = module.Imdb
    build, annotate = Imdb._build_work_dict, Imdb._load_anno

    def _build_work_dict(self, cutoff):
        if not isinstance(self.data_file, Synthetic):
            return build(self, cutoff)
        word_idx = {f"w{i}": i for i in range(IMDB_VOCAB)}
        word_idx["<unk>"] = IMDB_VOCAB
        return word_idx

    def _load_anno(self):
        if not isinstance(self.data_file, Synthetic):
            return annotate(self)
        n_train, n_test = synth.counts(25000, 25000)
        docs, y = synth.sequences("paddle_imdb", self.mode, n_train if self.mode == "train" else n_test, IMDB_VOCAB, 2)
        order = np.argsort(y, kind="stable")  # as read: every label 0 (pos) first, then every 1 (neg)
        self.docs = [[w - 1 for w in docs[i]] for i in order]  # word ranks 1.. to ids 0..
        self.labels = [int(y[i]) for i in order]

    Imdb._build_work_dict, Imdb._load_anno = _build_work_dict, _load_anno
    _mark(Imdb)


def patch_uci_housing(module) -> None:
    module._check_exists_and_download = _check_exists_and_download
    UCIHousing = module.UCIHousing
    load = UCIHousing._load_data

    def _load_data(self, feature_num=14, ratio=0.8):
        if not isinstance(self.data_file, Synthetic):
            return load(self, feature_num, ratio)
        data = synth.housing("boston_housing", synth.total(506))  # the same table as Keras's boston_housing
        maximums, minimums, avgs = data.max(axis=0), data.min(axis=0), data.sum(axis=0) / data.shape[0]
        for i in range(feature_num - 1):
            data[:, i] = (data[:, i] - avgs[i]) / (maximums[i] - minimums[i])
        offset = int(data.shape[0] * ratio)
        self.data = data[:offset] if self.mode == "train" else data[offset:]

    UCIHousing._load_data = _load_data
    _mark(UCIHousing)


HOOKS = {
    "paddle.vision.datasets.mnist": patch_mnist,
    "paddle.vision.datasets.cifar": patch_cifar,
    "paddle.text.datasets.imdb": patch_imdb,
    "paddle.text.datasets.uci_housing": patch_uci_housing,
}
