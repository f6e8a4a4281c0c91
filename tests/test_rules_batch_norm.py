"""batch-norm: a training script's batch normalisation layers are named in a note (issue 18): launched, each rank
normalises over its own share of the batch, which verify measures as a difference (1e-1 relative on a CNN)."""

from rule_testing import convert_text, findings_of

NET = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3)
        self.bn1 = nn.BatchNorm2d(8)
        self.head = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4))

model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.utils.data.DataLoader(range(8), batch_size=2):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
"""


def test_the_layers_are_named_once_with_the_share_each_rank_normalises():
    [note] = findings_of(convert_text(NET, batch="global"), "batch-norm", "note")
    assert "batch normalisation (bn1, BatchNorm1d)" in note.message and "B/N samples" in note.message
    assert "--sync-batchnorm" in note.fix


def test_sync_batchnorm_puts_the_strategy_in_init_and_says_where_it_runs():
    result = convert_text(NET, batch="global", sync_batchnorm=True)
    [note] = findings_of(result, "batch-norm", "note")
    assert "batch normalisation (bn1, BatchNorm1d) synchronised over the ranks when launched" in note.message
    assert "on GPUs" in note.message and "stops at dp.distributed_model" in note.message
    assert "dp.init(dp.Strategy(sync_batchnorm=True))\n" in result.output.decode()
    assert "nn.BatchNorm2d(8)" in result.output.decode()  # the runtime converts the layers, not the codemod


def test_a_file_that_only_defines_a_model_gets_no_note():
    assert not findings_of(convert_text(NET.split("model = Net()")[0]), "batch-norm")


KERAS = """
import tensorflow as tf

def build(opts):
    inputs = tf.keras.Input(shape=(8,))
    h = tf.keras.layers.BatchNormalization()(inputs)
    h = tf.keras.layers.BatchNormalization(
        momentum=0.9,
    )(h)
    h = tf.keras.layers.BatchNormalization(fused=True)(h)
    h = tf.keras.layers.BatchNormalization(synchronized=False)(h)
    h = tf.keras.layers.BatchNormalization(**opts)(h)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1)(h))

model = build({})
model.compile(optimizer="sgd", loss="mse")
model.fit(tf.zeros((8, 8)), tf.zeros((8, 1)), batch_size=4)
"""


def test_sync_batchnorm_gives_keras_layers_synchronized_true_in_the_layout_of_the_call():
    result = convert_text(KERAS, batch="global", sync_batchnorm=True)
    out = result.output.decode()
    assert "h = tf.keras.layers.BatchNormalization(synchronized=True)(inputs)\n" in out
    assert "BatchNormalization(\n        momentum=0.9,\n        synchronized=True,\n    )(h)" in out
    assert "BatchNormalization(synchronized=False)(h)" in out  # the script chose
    assert "BatchNormalization(**opts)(h)" in out  # may hold synchronized= or fused=: left alone
    assert [f.line for f in findings_of(result, "batch-norm", "change")] == [6, 7]
    [declined] = findings_of(result, "batch-norm", "declined")
    assert declined.line == 10 and "fused=True" in declined.message and "synchronized=True" in declined.fix
    assert "BatchNormalization(fused=True)(h)" in out


def test_without_the_flag_keras_layers_are_only_noted():
    result = convert_text(KERAS, batch="global")
    assert "synchronized=True" not in result.output.decode()
    [note] = findings_of(result, "batch-norm", "note")
    assert "--sync-batchnorm" in note.fix


PADDLE = """
import paddle

net = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.BatchNorm1D(8), paddle.nn.Linear(8, 1))
opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
for x in paddle.io.DataLoader(paddle.io.TensorDataset([paddle.ones([8, 4])]), batch_size=4):
    loss = net(x[0]).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
"""
HAPI = """
import paddle

net = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.BatchNorm1D(8), paddle.nn.Linear(8, 1))
model = paddle.Model(net)
model.prepare(paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters()), paddle.nn.MSELoss())
model.fit(paddle.io.TensorDataset([paddle.ones([8, 4]), paddle.ones([8, 1])]), batch_size=4)
"""


def test_paddle_sync_batchnorm_goes_through_the_strategy():
    result = convert_text(PADDLE, batch="global", sync_batchnorm=True)
    assert "dp.init(dp.Strategy(sync_batchnorm=True))\n" in result.output.decode()
    [note] = findings_of(result, "batch-norm", "note")
    assert "BatchNorm1D) synchronised over the ranks when launched" in note.message


def test_a_paddle_model_that_distributes_itself_is_declined_with_the_manual_conversion():
    result = convert_text(HAPI, batch="global", sync_batchnorm=True)
    [declined] = findings_of(result, "batch-norm", "declined")
    assert declined.line == 5 and "paddle.Model(...) wraps its network" in declined.message
    assert "convert_sync_batchnorm(net) before paddle.Model(net)" in declined.fix


KERAS_LOOP = """
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.BatchNormalization(), tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.1)
for x, y in tf.data.Dataset.from_tensor_slices((tf.zeros((8, 8)), tf.zeros((8, 1)))).batch(4):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
"""


def test_a_keras_custom_loop_is_declined_as_its_layers_would_have_no_replicas_to_synchronise_with():
    result = convert_text(KERAS_LOOP, batch="global", sync_batchnorm=True)
    assert "synchronized=True" not in result.output.decode()
    [declined] = findings_of(result, "batch-norm", "declined")
    assert "its own loop (opt.apply_gradients(...))" in declined.message and "model.fit" in declined.fix


LIBRARY_MODELS = {
    "torch": """
import torch
import torchvision

model = torchvision.models.resnet18(num_classes=10)
head = torchvision.models.alexnet()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in torch.utils.data.DataLoader(DATA, batch_size=2):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
""",
    "paddle": """
import paddle
from paddle.vision.models import resnet18, vgg16

net = resnet18(num_classes=2)
plain = vgg16()
with_bn = vgg16(batch_norm=True)
model = paddle.Model(net)
model.prepare(paddle.optimizer.Adam(parameters=net.parameters()), paddle.nn.CrossEntropyLoss())
model.fit(DATA, batch_size=4)
""",
    "tensorflow": """
import tensorflow as tf

model = tf.keras.applications.MobileNetV2(weights=None, classes=10)
other = tf.keras.applications.VGG16(weights=None)
model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
model.fit(X, Y, batch_size=4)
""",
}
EXPECTED = {"torch": "(the layers of resnet18(...))", "paddle": "(the layers of resnet18(...), the layers of vgg16(...))",
            "tensorflow": "(the layers of MobileNetV2(...))"}


def test_a_library_model_built_of_batch_normalisation_layers_is_noted_like_the_layers():
    """The issue 19 audit's landmark tutorial: a paddle.vision ResNet under paddle.Model trained 2e-3 apart from
    one process with nothing said (its layers are in the library, not the script). Models without such layers
    (alexnet, a plain vgg16, VGG16) are not named."""
    for framework, script in LIBRARY_MODELS.items():
        [note] = findings_of(convert_text(script, batch="global"), "batch-norm", "note")
        assert f"batch normalisation {EXPECTED[framework]}: launched" in note.message, (framework, note.message)


def test_sync_batchnorm_declines_a_keras_application_it_cannot_give_synchronized_true():
    result = convert_text(LIBRARY_MODELS["tensorflow"], sync_batchnorm=True)
    [declined] = findings_of(result, "batch-norm", "declined")
    assert "MobileNetV2(...) builds its batch normalisation layers itself" in declined.message
    assert "synchronized" not in result.output.decode()


def test_a_model_built_from_a_local_modules_batch_norm_class_is_noted(tmp_path, capsys):
    """image_classification_paddle (issue 19 audit): ``models/resnet.py`` builds ``BatchNorm2D`` layers, the
    script calls ``resnet18()``: its ranks printed different validation figures with nothing said."""
    from dpmigrate.cli import main

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "resnet.py").write_text(
        "import paddle.nn as nn\n\n\nclass Block(nn.Layer):\n    def __init__(self):\n        super().__init__()\n"
        "        self.bn = nn.BatchNorm2D(4)\n\n\ndef resnet18(num_classes=2):\n    return Block()\n\n\n"
        "def plain():\n    return nn.Linear(2, 2)\n")
    script = tmp_path / "train.py"
    script.write_text("import paddle\nfrom models.resnet import plain, resnet18\n\nmodel = resnet18()\nhead = plain()\n"
                      "opt = paddle.optimizer.SGD(parameters=model.parameters())\nfor x in paddle.io.DataLoader(DATA, "
                      "batch_size=2):\n    model(x).sum().backward()\n    opt.step()\n")
    main(["--check", str(script)])
    err = capsys.readouterr().err
    assert "train.py:4:9: note batch-norm: batch normalisation (the layers of resnet18(...)): launched" in err, err


def test_a_library_model_a_local_helper_builds_is_noted(tmp_path, capsys):
    """A steel-defect classifier (issue 19 audit round I): ``_common.build_model(name)`` imports
    ``paddle.vision.models.mobilenet_v3_small`` inside the function and returns it; nothing was said."""
    from dpmigrate.cli import main

    (tmp_path / "_common.py").write_text(
        "import paddle\n\n\ndef build_model(name, num_classes=6):\n    if name == 'mobilenet_v3_small':\n"
        "        from paddle.vision.models import mobilenet_v3_small\n"
        "        return mobilenet_v3_small(num_classes=num_classes)\n    return paddle.nn.Linear(2, 2)\n")
    script = tmp_path / "train.py"
    script.write_text("import paddle\nfrom _common import build_model\n\nmodel = build_model('mobilenet_v3_small')\n"
                      "opt = paddle.optimizer.SGD(parameters=model.parameters())\nfor x in paddle.io.DataLoader(DATA, "
                      "batch_size=2):\n    model(x).sum().backward()\n    opt.step()\n")
    main(["--check", str(script)])
    err = capsys.readouterr().err
    assert "train.py:4:9: note batch-norm: batch normalisation (the layers of build_model(...)): launched" in err, err
