"""shared-random-data: data drawn once without a seed is broadcast from rank 0 (a public regression example diverged)."""

from rule_testing import convert_text, findings_of

SCRIPT = """
import torch
{seed}
TARGET = torch.randn(3, 1) * 5


def batch():
    x = torch.randn(8, 3)
    return x, x @ TARGET


def main():
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10):
        x, y = batch()
        opt.zero_grad(); (model(x) - y).pow(2).mean().backward(); opt.step()


main()
"""


def test_a_target_drawn_once_without_a_seed_is_rank_0s_on_every_rank():
    result = convert_text(SCRIPT.format(seed=""))
    converted = result.output.decode()
    assert "TARGET = dp.broadcast(torch.randn(3, 1) * 5)" in converted
    assert "    x = torch.randn(8, 3)\n" in converted  # a fresh batch per step stays per rank
    assert len(findings_of(result, "shared-random-data", "change")) == 1


def test_a_seeded_script_is_left_alone():
    result = convert_text(SCRIPT.format(seed="torch.manual_seed(0)"))
    assert "broadcast" not in result.output.decode()


# --- issue 18: the same rule in every framework, and the shapes real scripts use -------------------------

HELPER_WITH_PYTHON_RANDOM = """
import random

import paddle


def make_rows(n):
    rows = []
    for _ in range(n):
        a, b = random.randint(0, 9), random.randint(0, 9)
        rows.append(([float(a), float(b)], [float(a + b)]))
    return rows


train_rows = make_rows(800)
dev_rows = make_rows(100)
net = paddle.nn.Linear(2, 1)
opt = paddle.optimizer.SGD(parameters=net.parameters())
for x, y in train_rows:
    loss = ((net(paddle.to_tensor([x])) - paddle.to_tensor([y])) ** 2).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
"""


def test_a_helper_looping_python_random_has_each_result_broadcast():
    converted = convert_text(HELPER_WITH_PYTHON_RANDOM).output.decode()
    assert "train_rows = dp.broadcast(make_rows(800))" in converted
    assert "dev_rows = dp.broadcast(make_rows(100))" in converted
    assert "random.randint(0, 9), random.randint(0, 9)\n" in converted  # the helper itself is unchanged


def test_numpy_drawn_at_module_level_in_a_keras_script_is_broadcast():
    converted = convert_text("""
        import numpy as np
        import tensorflow as tf
        from tensorflow.keras.utils import to_categorical

        x = np.random.random((256, 10)).astype("float32")
        y = to_categorical(np.random.randint(3, size=(256, 1)), num_classes=3)
        model = tf.keras.Sequential([tf.keras.layers.Dense(3)])
        model.compile(optimizer="sgd", loss="categorical_crossentropy")
        model.fit(x, y, batch_size=32)
    """).output.decode()
    assert 'x = dp.broadcast(np.random.random((256, 10)).astype("float32"))' in converted
    assert "y = dp.broadcast(to_categorical(np.random.randint(3, size=(256, 1)), num_classes=3))" in converted


def test_a_comprehension_and_a_filled_list_are_broadcast_whole():
    converted = convert_text("""
        import random
        import torch

        points = [random.uniform(-1, 1) for _ in range(200)]
        labels = []
        for p in points:
            labels.append(1.0 if p + random.gauss(0, 0.1) > 0 else 0.0)
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for p, t in zip(points, labels):
            opt.zero_grad()
            ((model(torch.tensor([[p]])) - t) ** 2).mean().backward()
            opt.step()
    """).output.decode()
    assert "points = dp.broadcast([random.uniform(-1, 1) for _ in range(200)])" in converted
    assert "    labels.append(1.0 if p + random.gauss(0, 0.1) > 0 else 0.0)\nlabels = dp.broadcast(labels)\n" in converted


def test_a_framework_draw_in_paddle_is_broadcast_and_each_generator_needs_its_own_seed():
    source = """
        import numpy as np
        import paddle
        {seed}
        W = paddle.randn([3, 1])
        X = np.random.rand(64, 3).astype("float32")
        net = paddle.nn.Linear(3, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        for i in range(0, 64, 8):
            x = paddle.to_tensor(X[i:i + 8])
            loss = ((net(x) - x @ W) ** 2).mean()
            loss.backward()
            opt.step()
            opt.clear_grad()
    """
    unseeded = convert_text(source.format(seed="")).output.decode()
    assert "W = dp.broadcast(paddle.randn([3, 1]))" in unseeded and "X = dp.broadcast(np.random.rand(" in unseeded
    numpy_seeded = convert_text(source.format(seed="np.random.seed(0)")).output.decode()
    assert "W = dp.broadcast(paddle.randn([3, 1]))" in numpy_seeded  # paddle's own generator is not seeded
    assert 'X = np.random.rand(64, 3).astype("float32")' in numpy_seeded


def test_objects_built_around_a_draw_are_not_sent():
    converted = convert_text("""
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        loader = DataLoader(TensorDataset(torch.randn(64, 3), torch.randn(64, 1)), batch_size=8)
        weight = torch.nn.Parameter(torch.randn(3, 1))
        opt = torch.optim.SGD([weight], lr=0.1)
        for x, y in loader:
            opt.zero_grad()
            ((x @ weight - y) ** 2).mean().backward()
            opt.step()
    """).output.decode()
    assert "broadcast" not in converted


def test_a_draw_that_only_feeds_a_file_the_main_process_writes_is_not_broadcast():
    converted = convert_text("""
        import torch

        model = torch.nn.Linear(3, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            opt.zero_grad()
            model(torch.ones(2, 3)).sum().backward()
            opt.step()
        with open("sample.txt", "w") as out:
            token = torch.multinomial(torch.softmax(model(torch.ones(1, 3)), 1), 1)
            out.write(str(token.item()))
    """).output.decode()
    assert "dp.broadcast" not in converted


def test_a_dataset_class_a_random_split_and_an_in_place_shuffle_are_shared():
    # torch audit D1, D4, D5: each rank trained on its own data set, split or validation set
    converted = convert_text("""
        import numpy as np
        import torch
        from torch.utils.data import DataLoader, Dataset, random_split

        class Noise(Dataset):
            def __init__(self, n):
                self.x = torch.randn(n, 8)
            def __len__(self):
                return len(self.x)
            def __getitem__(self, i):
                return self.x[i]

        full = Noise(600)
        train_set, val_set = random_split(full, [500, 100])
        order = np.arange(500)
        np.random.shuffle(order)
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in DataLoader(train_set, batch_size=32):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    """).output.decode()
    assert "        self.x = dp.broadcast(torch.randn(n, 8))\n" in converted
    assert "train_set, val_set = dp.broadcast(random_split(full, [500, 100]))\n" in converted
    assert "np.random.shuffle(order)\norder = dp.broadcast(order)\n" in converted
