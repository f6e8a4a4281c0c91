"""device-variable: a device reaching .to() through a variable is traced, and a fixed GPU is declined (issue 8, defect 3)."""

from rule_testing import convert_text, findings_of

TRAIN = """
import torch

def main(device):
    model = torch.nn.Linear(2, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    model(torch.ones(4, 2, device=device)).sum().backward()
    opt.step()

if __name__ == "__main__":
{chosen}
    main(device)
"""


def _declined(chosen: str):
    return findings_of(convert_text(TRAIN.format(chosen=chosen)), "device-variable", "declined")


def test_a_gpu_index_passed_to_main_becomes_this_ranks_index_where_it_is_chosen():
    # issue 8, defect 3: `device = 0` passed to main(device) used to pass silently
    result = convert_text(TRAIN.format(chosen="    device = 0"))
    assert "    device = dp.local_rank()\n    main(device)\n" in result.output.decode()
    [change] = findings_of(result, "device-variable", "change")
    assert (change.line, change.col) == (12, 14) and "`device = 0` (GPU 0) -> dp.local_rank()" in change.message


def test_a_cuda_string_with_an_index_is_declined():
    assert len(_declined('    device = "cuda:1"')) == 1


def test_devices_the_converter_makes_rank_aware_pass():
    for chosen in (
        '    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")',
        "    device = 'cuda' if torch.cuda.is_available() else 'cpu'",
        '    device = torch.device("cuda:{}".format(0))',
        '    device = "cpu"',
        '    device = "cuda"',
        "    device = next(iter([torch.ones(1)])).device",
    ):
        assert _declined(chosen) == [], chosen


def test_a_default_parameter_value_is_traced():
    result = convert_text(
        """
        import torch

        def main(device=0):
            model = torch.nn.Linear(2, 1).to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad(); model(torch.ones(4, 2)).sum().backward(); opt.step()

        main()
        """
    )
    declined = findings_of(result, "device-variable", "declined")
    assert len(declined) == 1 and declined[0].line == 4


def test_a_device_from_an_untraceable_call_is_declined_with_the_fix():
    declined = _declined("    device = pick_device()")
    assert len(declined) == 1 and "cannot tell which device" in declined[0].message


def test_a_fixed_gpu_handed_to_a_trainer_class_becomes_this_ranks_index():
    # the DDP tutorial's single-GPU shape: device = 0 -> main(device) -> Trainer(..., device) -> model.to(gpu_id)
    result = convert_text(
        """
        import torch

        class Trainer:
            def __init__(self, model, optimizer, gpu_id):
                self.gpu_id = gpu_id
                self.model = model.to(gpu_id)
                self.optimizer = optimizer

            def step(self, x):
                self.optimizer.zero_grad()
                self.model(x.to(self.gpu_id)).sum().backward()
                self.optimizer.step()

        def main(device):
            model = torch.nn.Linear(2, 1)
            trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), device)
            trainer.step(torch.ones(4, 2))

        if __name__ == "__main__":
            device = 0
            main(device)
        """
    )
    assert "    device = dp.local_rank()\n    main(device)\n" in result.output.decode()
    assert findings_of(result, "device-variable", "declined") == []
