"""Data rules: training loaders sharded by data flow, evaluation loaders sharded only when exact,
--batch global, hand-batched loops reported."""

from rule_testing import convert_text, findings_of

SCRIPT = """
import torch
from torch.utils.data import DataLoader

def train(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        model(x).sum().backward()
        optimizer.step()

def test(model, loader):
    correct = 0
    total_loss = 0.0
    with torch.no_grad():
        for x, y in loader:
            total_loss += model(x).sum().item()
            correct += (model(x).argmax(1) == y).sum().item()
    print(correct / len(loader.dataset), total_loss)

def main():
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)
    eval_loader = DataLoader(test_set, batch_size=100)
    train(model, train_loader, optimizer)
    test(model, eval_loader)
"""


def _converted(source=SCRIPT, **options):
    result = convert_text(source, **options)
    return result, result.output.decode()


def test_a_loader_whose_batches_reach_backward_is_sharded():
    result, text = _converted()
    assert "train_loader = dp.distributed_loader(DataLoader(train_set, batch_size=64, shuffle=True))" in text
    [finding] = findings_of(result, "shard-training-loader", "change")
    assert (finding.line, finding.col) == (21, 20)


def test_an_evaluation_loader_that_only_sums_is_sharded_and_its_sums_all_reduced():
    result, text = _converted()
    assert "eval_loader = dp.distributed_loader(DataLoader(test_set, batch_size=100), evaluation=True)" in text
    assert (
        "            correct += (model(x).argmax(1) == y).sum().item()\n"
        '        total_loss = dp.all_reduce(total_loss, op="sum")\n'
        '        correct = dp.all_reduce(correct, op="sum")\n'
        "    dp.print(correct / len(loader.dataset), total_loss)\n"
    ) in text
    assert findings_of(result, "evaluation-loader", "change")


def test_an_evaluation_loop_that_collects_predictions_leaves_its_loader_whole():
    source = SCRIPT.replace(
        "            correct += (model(x).argmax(1) == y).sum().item()\n",
        "            correct += (model(x).argmax(1) == y).sum().item()\n            preds.append(model(x))\n",
    )
    result, text = _converted(source)
    assert "eval_loader = DataLoader(test_set, batch_size=100)" in text
    assert "all_reduce" not in text
    [note] = findings_of(result, "evaluation-loader", "note")
    assert "preds.append" in note.message and "left whole" in note.message


def test_dividing_by_the_number_of_batches_leaves_the_loader_whole():
    source = SCRIPT.replace("print(correct / len(loader.dataset), total_loss)", "print(total_loss / len(loader))")
    result, text = _converted(source)
    assert "evaluation=True" not in text
    [note] = findings_of(result, "evaluation-loader", "note")
    assert "len(loader)" in note.message


def test_a_loader_whose_batches_cannot_be_followed_is_declined():
    result, text = _converted(
        "import torch\nloader = torch.utils.data.DataLoader(ds, batch_size=8)\nbatches = iter(loader)\n"
    )
    assert "distributed_loader" not in text
    [finding] = findings_of(result, "shard-training-loader", "declined")
    assert (finding.line, finding.col) == (2, 10)


def test_a_training_loader_with_its_own_sampler_is_declined():
    source = SCRIPT.replace("batch_size=64, shuffle=True", "batch_size=64, sampler=my_sampler")
    result, text = _converted(source)
    assert "dp.distributed_loader(DataLoader(train_set" not in text
    assert findings_of(result, "shard-training-loader", "declined")


def test_global_batch_rewrites_a_keyword_batch_size():
    _, text = _converted(batch="global")
    assert "DataLoader(train_set, batch_size=dp.per_rank_batch_size(64), shuffle=True)" in text
    assert "DataLoader(test_set, batch_size=100)" in text  # evaluation batches are left as they are


def test_global_batch_rewrites_the_batch_size_in_a_kwargs_dict():
    source = SCRIPT.replace(
        "    train_loader = DataLoader(train_set, batch_size=64, shuffle=True)\n",
        "    train_kwargs = {'batch_size': args.batch_size}\n"
        "    train_kwargs.update({'shuffle': True})\n"
        "    train_loader = DataLoader(train_set, **train_kwargs)\n",
    )
    result, text = _converted(source, batch="global")
    assert "train_kwargs = {'batch_size': dp.per_rank_batch_size(args.batch_size)}" in text
    assert findings_of(result, "global-batch-size", "change")


def test_global_batch_rewrites_a_positional_batch_size():
    _, text = _converted(SCRIPT.replace("batch_size=64, shuffle=True", "args.bs"), batch="global")
    assert "DataLoader(train_set, dp.per_rank_batch_size(args.bs))" in text


def test_global_batch_declines_a_loader_without_a_batch_size():
    source = SCRIPT.replace("DataLoader(train_set, batch_size=64, shuffle=True)", "DataLoader(train_set)")
    result, _ = _converted(source, batch="global")
    [finding] = findings_of(result, "global-batch-size", "declined")
    assert "batch_size=dp.per_rank_batch_size" in finding.fix


def test_per_device_batch_keeps_the_batch_size():
    _, text = _converted()
    assert "per_rank_batch_size" not in text


def test_hand_batched_training_is_reported_with_how_to_shard_it():
    result, text = _converted(
        """
        import torch
        data = torch.randn(100, 3)
        for i in range(0, 100, 10):
            model(data[i:i + 10]).sum().backward()
        """
    )
    [note] = findings_of(result, "manual-batching", "note")
    assert "every rank reads all the data" in note.message and "dp.shard" in note.fix
    assert "dp.init()" in text


def test_a_training_sum_divided_by_the_dataset_size_is_summed_over_ranks():
    source = SCRIPT.replace(
        "    for x, y in loader:\n        optimizer.zero_grad()\n",
        "    total = 0\n    for x, y in loader:\n        total += 1.0\n        optimizer.zero_grad()\n",
    ).replace(
        "        optimizer.step()\n\ndef test",
        "        optimizer.step()\n    print(total / len(loader.dataset))\n\ndef test",
    )
    result, text = _converted(source)
    assert '        optimizer.step()\n    total = dp.all_reduce(total, op="sum")\n    dp.print(total' in text
    assert findings_of(result, "training-dataset-averages", "change")


def test_a_training_sum_that_is_only_logged_stays_per_rank():
    _, text = _converted(SCRIPT)
    assert text.count("all_reduce") == 2  # only the evaluation sums
