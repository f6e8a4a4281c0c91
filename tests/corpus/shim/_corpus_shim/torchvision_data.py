"""Synthetic ``torchvision.datasets``: MNIST, FashionMNIST, KMNIST, EMNIST, CIFAR10, CIFAR100, SVHN and STL10.

Why the real classes are patched in place (not replaced): scripts subclass them, test ``isinstance`` and read
``.data``, ``.targets``, ``.classes``; the real ``__getitem__`` (PIL image through ``transform``, target through
``target_transform``) and ``__len__`` then run unchanged on synthetic arrays of the real layout (MNIST: uint8
tensors and int64 targets; CIFAR: a uint8 HWC numpy array and a list of ints; SVHN and STL10: uint8 CHW arrays).
Only a download is replaced: files already on disk under ``root`` are read as usual. ``download=True`` is ignored.
``ImageFolder``/``DatasetFolder`` are left alone (a missing folder still fails as it should).
"""

from __future__ import annotations

import os

import numpy as np

from . import synth

# real (train, test) sizes; EMNIST's by split
MNIST_SIZES = {"MNIST": (60000, 10000), "FashionMNIST": (60000, 10000), "KMNIST": (60000, 10000)}
EMNIST_SIZES = {"byclass": (697932, 116323), "bymerge": (697932, 116323), "balanced": (112800, 18800),
                "letters": (124800, 20800), "digits": (240000, 40000), "mnist": (60000, 10000)}
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
CIFAR100_CLASSES = """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel
can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin elephant
flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree
motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy
porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail snake spider squirrel
streetcar sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip turtle wardrobe whale
willow_tree wolf woman worm""".split()
STL10_CLASSES = ["airplane", "bird", "car", "cat", "deer", "dog", "horse", "monkey", "ship", "truck"]


def _no_download(self) -> None:
    """Nothing to fetch: what is not on disk is made up when loaded."""


def _split_images(name: str, train: bool, real: tuple[int, int], shape, num_classes: int):
    n_train, n_test = synth.counts(*real)
    split = "train" if train else "test"
    return synth.images(name, split, n_train if train else n_test, shape, num_classes)


def patch_mnist(module) -> None:
    import torch

    def synthetic(self):
        base = next(c for c in type(self).__mro__ if c.__module__ == module.__name__)
        if base is module.EMNIST:
            real, num_classes, first = EMNIST_SIZES[self.split], len(self.classes_split_dict[self.split]), 0
            if self.split == "letters":  # classes ["N/A", "a", ...]: targets 1..26
                num_classes, first = 26, 1
            name = f"emnist_{self.split}"
        else:
            real, num_classes, first = MNIST_SIZES[base.__name__], 10, 0
            name = {"MNIST": "mnist", "FashionMNIST": "fashion_mnist"}.get(base.__name__, base.__name__.lower())
        x, y = _split_images(name, self.train, real, (28, 28), num_classes)
        return torch.from_numpy(x), torch.from_numpy(y + first)

    for cls in (module.MNIST, module.EMNIST):
        check, load = cls._check_exists, cls._load_data

        def _load_data(self, check=check, load=load):
            return load(self) if check(self) else synthetic(self)

        cls._load_data = _load_data
        cls._check_exists = lambda self: True
        cls.download = _no_download
        cls.dpmigrate_corpus_shim = True


def _patch_init(cls, on_disk, synthetic) -> None:
    """``cls.__init__`` reads the files on disk when they are there, else fills the instance with ``synthetic``."""
    real_init = cls.__init__

    def __init__(self, root, *args, **kwargs):
        probe = object.__new__(type(self))  # what the real checks read: root and the class's file lists
        probe.root = os.path.expanduser(root) if isinstance(root, str) else root
        if on_disk(probe, *args, **kwargs):  # (its download is the no-op below)
            return real_init(self, root, *args, **kwargs)
        synthetic(self, root, *args, **kwargs)

    __init__.__doc__ = real_init.__doc__
    cls.__init__ = __init__
    cls.download = _no_download
    cls.dpmigrate_corpus_shim = True


def patch_cifar(module) -> None:
    CIFAR10 = module.CIFAR10
    integrity = CIFAR10._check_integrity

    def synthetic(self, root, train=True, transform=None, target_transform=None, download=False):
        super(CIFAR10, self).__init__(root, transform=transform, target_transform=target_transform)
        self.train = train
        hundred = isinstance(self, module.CIFAR100)
        self.classes = list(CIFAR100_CLASSES if hundred else CIFAR10_CLASSES)
        x, y = _split_images("cifar100" if hundred else "cifar10", train, (50000, 10000), (32, 32, 3), len(self.classes))
        self.data, self.targets = x, y.tolist()
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

    _patch_init(CIFAR10, lambda probe, *a, **k: integrity(probe), synthetic)


def patch_svhn(module) -> None:
    SVHN = module.SVHN
    integrity = SVHN._check_integrity
    sizes = {"train": 73257, "test": 26032, "extra": 531131}

    def on_disk(probe, split="train", *args, **kwargs):
        if split not in SVHN.split_list:
            return False  # the synthetic path raises the real error
        probe.split, probe.filename = split, SVHN.split_list[split][1]
        return integrity(probe)

    def synthetic(self, root, split="train", transform=None, target_transform=None, download=False):
        super(SVHN, self).__init__(root, transform=transform, target_transform=target_transform)
        self.split = module.verify_str_arg(split, "split", tuple(self.split_list.keys()))
        self.url, self.filename, self.file_md5 = self.split_list[split]
        n = min(sizes[split], synth.samples() if split != "test" else max(1, synth.samples() // 4))
        x, self.labels = synth.images("svhn", split, n, (32, 32, 3), 10)
        self.data = np.ascontiguousarray(x.transpose(0, 3, 1, 2))

    _patch_init(SVHN, on_disk, synthetic)


def patch_stl10(module) -> None:
    STL10 = module.STL10
    integrity = STL10._check_integrity

    def part(split: str, labelled: bool):
        real = {"train": 5000, "test": 8000, "unlabeled": 100000}[split]
        n = min(real, synth.samples() if split != "test" else max(1, synth.samples() // 4))
        x, y = synth.images("stl10", split, n, (96, 96, 3), 10)
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2)), (y.astype(np.uint8) if labelled else np.full(n, -1))

    def synthetic(self, root, split="train", folds=None, transform=None, target_transform=None, download=False):
        super(STL10, self).__init__(root, transform=transform, target_transform=target_transform)
        self.split = module.verify_str_arg(split, "split", self.splits)
        self.folds = self._verify_folds(folds)
        if self.split == "test":
            self.data, self.labels = part("test", True)
        elif self.split == "unlabeled":
            self.data, self.labels = part("unlabeled", False)
        else:
            self.data, self.labels = part("train", True)
            if self.folds is not None:  # one fold: a fifth of the training set, as the real 1,000 of 5,000
                self.data, self.labels = self.data[self.folds % 5 :: 5], self.labels[self.folds % 5 :: 5]
            if self.split == "train+unlabeled":
                more, _ = part("unlabeled", False)
                self.data = np.concatenate((self.data, more))
                self.labels = np.concatenate((self.labels, np.asarray([-1] * more.shape[0])))
        self.classes = list(STL10_CLASSES)

    _patch_init(STL10, lambda probe, *a, **k: integrity(probe), synthetic)


HOOKS = {
    "torchvision.datasets.mnist": patch_mnist,
    "torchvision.datasets.cifar": patch_cifar,
    "torchvision.datasets.svhn": patch_svhn,
    "torchvision.datasets.stl10": patch_stl10,
}
