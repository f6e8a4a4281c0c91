"""The corpus's synthetic-data shim (tests/corpus/shim): real frameworks, in subprocesses, as a corpus run has it.

Each framework test runs a small script twice, in two processes with the shim on ``PYTHONPATH`` and
``DPMIGRATE_CORPUS_SHIM=1``: the datasets load with no network, with the real structure, shapes, dtypes and value
ranges at the shim's sample counts; the two processes read the same bytes (what ``dpmigrate verify`` needs of the
original's process and every rank's); loading leaves the global random state of numpy, ``random`` and the
framework as it was. Without ``DPMIGRATE_CORPUS_SHIM`` nothing is patched, and the ``sitecustomize`` the shim
shadows still runs (also behind dpmigrate verify's own boot ``sitecustomize``, which runs the shim).

This process imports no framework; the keras and paddle tests take several seconds each (slow). The torchvision
test runs where torchvision imports (the corpus venv, tests/corpus/setup), and is skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SHIM = Path(__file__).resolve().parent / "corpus" / "shim"

PRELUDE = """
import gzip, hashlib, json, random, struct, sys
from pathlib import Path
import numpy as np

def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()

def snapshot():
    return (random.getstate(), np.random.get_state()[1].tobytes())

def shim_finders():
    return [f for f in sys.meta_path if getattr(f, "dpmigrate_corpus_shim", False)]
"""


def _run(code: str, tmp_path: Path, shim: bool = True, path: list[Path] | None = None, prelude: bool = True, **extra: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPMIGRATE_CORPUS", "DPMIGRATE_VERIFY"))}
    env.update(OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3", DPMIGRATE_CORPUS_CACHE=str(tmp_path / "cache"), **extra)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [*(path or [SHIM]), *filter(None, [os.environ.get("PYTHONPATH")])])
    if shim:
        env["DPMIGRATE_CORPUS_SHIM"] = "1"
    return subprocess.run([sys.executable, "-c", (PRELUDE if prelude else "") + textwrap.dedent(code)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def _result(code: str, tmp_path: Path, **kwargs) -> dict:
    """Run ``code``; the JSON object its last line of output prints."""
    proc = _run(code, tmp_path, **kwargs)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "dpmigrate corpus shim: could not prepare" not in proc.stderr, proc.stderr[-5000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _twice(code: str, tmp_path: Path) -> dict:
    """Run ``code`` in two processes (different hash seeds, different working folders); they must agree."""
    first = _result(code, _folder(tmp_path / "a"))
    second = _result(code, _folder(tmp_path / "b"))
    assert first == second  # the same bytes in every process
    return first


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- fast: no framework ------------------------------------------------------------------------------------------


def test_off_without_the_variable_and_runs_the_shadowed_sitecustomize(tmp_path):
    later = _folder(tmp_path / "later")
    (later / "sitecustomize.py").write_text("import sys\nsys.shadowed_ran = getattr(sys, 'shadowed_ran', 0) + 1\n")
    code = """
    import json, sys
    finders = [f for f in sys.meta_path if getattr(f, "dpmigrate_corpus_shim", False)]
    print(json.dumps({"finders": len(finders), "loaded": "_corpus_shim" in sys.modules, "numpy": "numpy" in sys.modules,
                      "shadowed": getattr(sys, "shadowed_ran", 0)}))
    """
    off = {"finders": 0, "loaded": False, "numpy": False, "shadowed": 1}
    on = {**off, "finders": 1, "loaded": True}
    assert _result(code, tmp_path, shim=False, path=[SHIM, later], prelude=False) == off
    assert _result(code, tmp_path, path=[SHIM, later], prelude=False) == on  # hooked, nothing imported yet
    # behind dpmigrate verify's boot sitecustomize (first on the path): each runs once, none twice
    boot = Path(importlib.util.find_spec("dpmigrate.verify.boot").submodule_search_locations[0])
    assert _result(code, tmp_path, path=[boot, SHIM, later], prelude=False) == on


def test_every_hooked_module_has_its_patch(tmp_path):
    code = """
    import importlib, _corpus_shim
    tables = {}
    for submodule in set(_corpus_shim.HOOKED.values()):
        tables.update(dict.fromkeys(importlib.import_module(f"_corpus_shim.{submodule}").HOOKS, submodule))
    print(json.dumps(tables == _corpus_shim.HOOKED))
    """
    assert _result(code, tmp_path) is True


def test_synthetic_data_is_seeded_by_name_and_split_only(tmp_path):
    code = """
    random.seed(1); np.random.seed(1)
    before = snapshot()
    from _corpus_shim import synth
    x, y = synth.images("mnist", "train", 64, (28, 28), 10)
    x2, _ = synth.images("mnist", "test", 64, (28, 28), 10)
    docs, labels = synth.sequences("imdb", "train", 16, 1000, 2)
    assert snapshot() == before  # the global generators untouched
    assert x.dtype == np.uint8 and y.dtype == np.int64 and sorted(set(y.tolist())) == list(range(10))
    assert digest(x) != digest(x2) and all(1 <= w <= 1000 for d in docs for w in d)
    print(json.dumps({"images": digest(x, y), "docs": digest(np.concatenate(docs), labels),
                      "counts": synth.counts(60000, 10000), "small": synth.counts(300, 100), "total": synth.total(506)}))
    """
    out = _twice(code, tmp_path)
    assert out["counts"] == [512, 128] and out["small"] == [300, 100] and out["total"] == 506


@pytest.mark.parametrize(("value", "counts"), [("40", [40, 10]), ("2", [2, 1]), ("abc", None), ("0", None)])
def test_samples_knob(tmp_path, value, counts):
    code = """
    from _corpus_shim import synth
    try:
        print(json.dumps(synth.counts(60000, 10000)))
    except ValueError as e:
        print(json.dumps(str(e)))
    """
    proc = _run(code, tmp_path, DPMIGRATE_CORPUS_SAMPLES=value)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if counts is None:  # refused, naming the knob
        assert "DPMIGRATE_CORPUS_SAMPLES" in out and value in out
    else:
        assert out == counts


# -- Keras (Keras 3 as keras and tf.keras, and tf_keras) -------------------------------------------------------------

KERAS = """
import keras, tensorflow as tf, tf_keras
before = snapshot()
out = {}
(x, y), (xt, yt) = keras.datasets.mnist.load_data()
assert x.shape == (512, 28, 28) and xt.shape == (128, 28, 28) and y.shape == (512,) and yt.shape == (128,)
assert x.dtype == y.dtype == np.uint8 and x.min() == 0 and x.max() == 255 and set(y.tolist()) == set(range(10))
out["mnist"] = digest(x, y, xt, yt)
for other in (tf.keras.datasets.mnist, tf_keras.datasets.mnist):  # the same data through every Keras
    assert digest(*other.load_data()[0], *other.load_data()[1]) == out["mnist"]
(x, y), (xt, yt) = keras.datasets.fashion_mnist.load_data()
assert x.shape == (512, 28, 28) and x.dtype == np.uint8 and y.dtype == np.uint8
out["fashion_mnist"] = digest(x, y, xt, yt)
(x, y), (xt, yt) = keras.datasets.cifar10.load_data()
assert x.shape == (512, 32, 32, 3) and xt.shape == (128, 32, 32, 3) and x.dtype == np.uint8
assert y.shape == (512, 1) and y.dtype == np.uint8 and int(y.max()) == 9
out["cifar10"] = digest(x, y, xt, yt)
keras.config.set_image_data_format("channels_first")
assert keras.datasets.cifar10.load_data()[0][0].shape == (512, 3, 32, 32)
keras.config.set_image_data_format("channels_last")
(x, y), (xt, yt) = tf_keras.datasets.cifar100.load_data(label_mode="coarse")
assert x.shape == (512, 32, 32, 3) and y.shape == (512, 1) and y.dtype == np.int64 and int(y.max()) == 19
(x, y), (xt, yt) = keras.datasets.imdb.load_data(num_words=1000, maxlen=200)
assert x.dtype == object and 0 < len(x) <= 512 and set(y.tolist()) == {0, 1} and y.dtype == np.int64
assert all(s[0] == 1 and len(s) < 200 and max(s) < 1000 for s in x)
assert len(keras.datasets.imdb.get_word_index()) == 88584
out["imdb"] = digest(np.concatenate(x.tolist()), y)
(x, y), (xt, yt) = tf_keras.datasets.reuters.load_data(num_words=500, test_split=0.2)
assert len(x) == 512 and len(xt) == 128 and y.dtype == np.int64 and 0 <= y.min() and y.max() <= 45
(x, y), (xt, yt) = keras.datasets.boston_housing.load_data()
assert x.shape == (404, 13) and xt.shape == (102, 13) and x.dtype == y.dtype == np.float64 and 5 <= y.min() <= y.max() <= 50
(x, y), (xt, yt) = keras.datasets.california_housing.load_data()
assert x.shape == (512, 8) and y.shape == (512,) and x.dtype == y.dtype == np.float32
path = keras.utils.get_file("mnist.npz", origin="https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz")
with np.load(path) as f:
    assert digest(f["x_train"], f["y_train"], f["x_test"], f["y_test"]) == out["mnist"]
text = open(tf.keras.utils.get_file("shakespeare.txt", "https://example.org/data/shakespeare.txt")).read()
assert len(text) > 50000
out["text"] = digest(np.frombuffer(text.encode(), np.uint8))
origin = "https://storage.googleapis.com/download.tensorflow.org/example_images/flower_photos.tgz"
for get_file in (keras.utils.get_file, tf_keras.utils.get_file):
    try:
        get_file("flower_photos", origin=origin, untar=True)
        raise AssertionError("get_file faked an archive it cannot make")
    except RuntimeError as e:
        assert f"dpmigrate corpus shim: cannot fake get_file({origin})" in str(e), e
assert snapshot() == before
print(json.dumps(out))
"""


@pytest.mark.slow
def test_keras_datasets(tmp_path):
    _twice(KERAS, tmp_path)


@pytest.mark.slow
def test_keras_untouched_without_the_variable(tmp_path):
    code = """
    import keras, tf_keras
    patched = [f for f in (keras.datasets.mnist.load_data, keras.datasets.imdb.get_word_index, keras.utils.get_file,
                           tf_keras.datasets.cifar10.load_data, tf_keras.utils.get_file)
               if getattr(f, "dpmigrate_corpus_shim", False)]
    print(json.dumps({"patched": len(patched), "finders": len(shim_finders())}))
    """
    assert _result(code, tmp_path, shim=False) == {"patched": 0, "finders": 0}


# -- Paddle ------------------------------------------------------------------------------------------------------------

PADDLE = """
import paddle
from paddle.vision.transforms import ToTensor
paddle.seed(7)
before = snapshot()
out = {}
ds = paddle.vision.datasets.MNIST(mode="train", backend="cv2")
image, label = ds[0]
assert len(ds) == 512 and image.shape == (28, 28) and image.dtype == np.float32 and 0 <= image.min() < image.max() <= 255
assert label.shape == (1,) and label.dtype == np.int64 and 0 <= int(label[0]) <= 9
out["mnist"] = digest(np.stack(ds.images), np.concatenate(ds.labels))
image, label = paddle.vision.datasets.MNIST(mode="train", backend="pil")[0]
assert image.mode == "L" and image.size == (28, 28) and label.dtype == np.int64
test = paddle.vision.datasets.FashionMNIST(mode="test", transform=ToTensor())
image, label = test[0]
assert len(test) == 128 and tuple(image.shape) == (1, 28, 28) and 0 <= float(image.min()) < float(image.max()) <= 1
ds = paddle.vision.datasets.Cifar10(mode="test", backend="cv2")
image, label = ds[0]
assert len(ds) == 128 and image.shape == (32, 32, 3) and image.dtype == np.float32 and label.dtype == np.int64
out["cifar10"] = digest(np.stack([d for d, _ in ds.data]), np.array([l for _, l in ds.data]))
ds = paddle.vision.datasets.Cifar100(mode="train", backend="pil")
assert len(ds) == 512 and ds[0][0].size == (32, 32) and max(l for _, l in ds.data) == 99
imdb = paddle.text.datasets.Imdb(mode="train")
doc, label = imdb[0]
assert len(imdb) == 512 and doc.dtype == np.int64 and label.shape == (1,) and "<unk>" in imdb.word_idx
assert imdb.labels == sorted(imdb.labels) and set(imdb.labels) == {0, 1}
out["imdb"] = digest(np.concatenate(imdb.docs), np.array(imdb.labels))
housing = paddle.text.datasets.UCIHousing(mode="train")
features, target = housing[0]
assert len(housing) == 404 and features.shape == (13,) and target.shape == (1,) and features.dtype == np.float32
out["uci_housing"] = digest(housing.data)
assert snapshot() == before
drawn = paddle.rand([4]).numpy().tolist()
paddle.seed(7)
assert paddle.rand([4]).numpy().tolist() == drawn  # Paddle's generator untouched too
with gzip.open("images.gz", "wb") as f:  # files the script names are read as usual
    f.write(struct.pack(">IIII", 2051, 100, 28, 28) + bytes(100 * 784))
with gzip.open("labels.gz", "wb") as f:
    f.write(struct.pack(">II", 2049, 100) + bytes(100))
assert len(paddle.vision.datasets.MNIST(image_path="images.gz", label_path="labels.gz", mode="test")) == 100
images, labels = next(iter(paddle.io.DataLoader(test, batch_size=64)))
assert images.shape == [64, 1, 28, 28] and labels.shape == [64, 1] and labels.dtype == paddle.int64
print(json.dumps(out))
"""


@pytest.mark.slow
def test_paddle_datasets(tmp_path):
    _twice(PADDLE, tmp_path)
    code = """
    import paddle
    classes = (paddle.vision.datasets.MNIST, paddle.vision.datasets.Cifar10, paddle.text.datasets.Imdb,
               paddle.text.datasets.UCIHousing)
    print(json.dumps({"patched": sum(hasattr(c, "dpmigrate_corpus_shim") for c in classes), "finders": len(shim_finders())}))
    """
    assert _result(code, tmp_path, shim=False) == {"patched": 0, "finders": 0}


# -- torchvision ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torchvision_imports():
    """Skip unless torchvision imports here (it does in the corpus venv; CI's venv has no torchvision)."""
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip("torchvision is not installed here (tests/corpus/setup makes a venv with it)")
    proc = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip(f"torchvision does not import here: {proc.stderr.strip().splitlines()[-1:]}")


TORCHVISION = """
import torch, torchvision
from torchvision import datasets
from torchvision.transforms import ToTensor
torch.manual_seed(7)
before = snapshot()
out = {}
train = datasets.CIFAR10(root="data", train=True, download=True, transform=ToTensor())
assert isinstance(train, torch.utils.data.Dataset) and len(train) == 512
assert isinstance(train.data, np.ndarray) and train.data.shape == (512, 32, 32, 3) and train.data.dtype == np.uint8
assert isinstance(train.targets, list) and set(train.targets) == set(range(10)) and len(train.classes) == 10
assert train.class_to_idx["airplane"] == 0
out["cifar10"] = digest(train.data, np.array(train.targets))
image, target = train[0]
assert tuple(image.shape) == (3, 32, 32) and image.dtype == torch.float32 and 0 <= image.min() < image.max() <= 1
assert isinstance(target, int)
test = datasets.CIFAR100("data", train=False, target_transform=lambda t: t + 1000)
assert len(test) == 128 and len(test.classes) == 100 and test[0][0].size == (32, 32) and test[0][1] >= 1000
mnist = datasets.MNIST("data", train=True, download=True)
assert isinstance(mnist.data, torch.Tensor) and mnist.data.shape == (512, 28, 28) and mnist.data.dtype == torch.uint8
assert mnist.targets.dtype == torch.int64 and int(mnist.targets.max()) == 9 and mnist.classes[0] == "0 - zero"
image, target = mnist[0]
assert image.mode == "L" and image.size == (28, 28) and isinstance(target, int)
out["mnist"] = digest(mnist.data.numpy(), mnist.targets.numpy())
assert len(datasets.FashionMNIST("data", train=False, download=True)) == 128
letters = datasets.EMNIST("data", split="letters", download=True)
assert 1 <= int(letters.targets.min()) and int(letters.targets.max()) == 26
svhn = datasets.SVHN("data", split="test", download=True)
assert svhn.data.shape == (128, 3, 32, 32) and svhn.labels.dtype == np.int64 and svhn[0][0].size == (32, 32)
stl = datasets.STL10("data", split="train+unlabeled", download=True)
assert stl.data.shape == (1024, 3, 96, 96) and stl.labels.min() == -1 and stl[0][0].size == (96, 96)
try:
    datasets.ImageFolder("no-such-folder")
    raise AssertionError("ImageFolder on a missing folder loaded")
except FileNotFoundError:
    pass
assert not Path("data").exists()  # nothing downloaded, nothing written
raw = Path("disk/MNIST/raw")  # files on disk are read as usual
raw.mkdir(parents=True)
for prefix, n in (("train", 3), ("t10k", 2)):
    (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + bytes(n * 784))
    (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, n) + bytes(n))
assert len(datasets.MNIST("disk", train=True)) == 3 and len(datasets.MNIST("disk", train=False, download=True)) == 2
assert snapshot() == before
drawn = torch.rand(4).tolist()
torch.manual_seed(7)
assert torch.rand(4).tolist() == drawn  # torch's generator untouched too
images, labels = next(iter(torch.utils.data.DataLoader(train, batch_size=64, shuffle=True)))
assert tuple(images.shape) == (64, 3, 32, 32) and labels.dtype == torch.int64
print(json.dumps(out))
"""


@pytest.mark.slow
def test_torchvision_datasets(tmp_path, torchvision_imports):
    _twice(TORCHVISION, tmp_path)
    code = """
    from torchvision import datasets
    classes = (datasets.MNIST, datasets.EMNIST, datasets.CIFAR10, datasets.SVHN, datasets.STL10)
    print(json.dumps({"patched": sum(hasattr(c, "dpmigrate_corpus_shim") for c in classes), "finders": len(shim_finders())}))
    """
    assert _result(code, tmp_path, shim=False) == {"patched": 0, "finders": 0}
