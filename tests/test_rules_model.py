"""distributed-model and replace-data-parallel: DDP after the model's set-up, DataParallel replaced."""

from rule_testing import assert_converts, convert_text, findings_of


def test_model_is_wrapped_after_it_is_on_its_device_and_initialised():
    assert_converts(
        """
        import torch

        def main():
            net = Net().to(device)
            net.apply(weights_init)
            print(net)
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            for x in data:
                optimizer.zero_grad()
                net(x).sum().backward()
                optimizer.step()

        if __name__ == "__main__":
            main()
        """,
        """
        import torch
        import dpmigrate.runtime.torch as dp

        def main():
            dp.init()
            net = Net().to(device)
            net.apply(weights_init)
            net = dp.distributed_model(net)
            dp.print(net)
            optimizer = dp.distributed_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
            for x in data:
                optimizer.zero_grad()
                net(x).sum().backward()
                optimizer.step()

        if __name__ == "__main__":
            main()
        """,
    )


def test_data_parallel_is_replaced_not_nested():
    assert_converts(
        """
        import torch
        from torch import nn

        model = Net().to(device)
        if torch.cuda.device_count() > 1:
            model = nn.DataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss.backward()
        torch.save(model.module.state_dict(), "m.pt")
        """,
        """
        import torch
        import dpmigrate.runtime.torch as dp

        dp.init()
        model = Net().to(device)
        model = dp.distributed_model(model)
        optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        loss.backward()
        dp.save(model.state_dict(), "m.pt")
        """,
    )


def test_data_parallel_inside_an_expression_keeps_the_rest():
    result = convert_text(
        """
        import torch
        model = torch.nn.DataParallel(model).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loss.backward()
        """
    )
    assert "model = model.to(dp.device())\nmodel = dp.distributed_model(model)\n" in result.output.decode()
    assert findings_of(result, "replace-data-parallel", "change")


def test_functional_data_parallel_becomes_a_plain_call():
    assert_converts(
        """
        import torch.nn as nn

        class G(nn.Module):
            def forward(self, input):
                return nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        """,
        """
        import torch.nn as nn

        class G(nn.Module):
            def forward(self, input):
                return self.main(input)
        """,
    )


def test_two_models_with_two_optimizers_are_both_wrapped():
    result = convert_text(
        """
        import torch.optim as optim
        netG = G().to(device)
        netD = D().to(device)
        optimizerD = optim.Adam(netD.parameters(), lr=2e-4)
        optimizerG = optim.Adam(netG.parameters(), lr=2e-4)
        for real in loader:
            errD.backward()
            optimizerD.step()
        """
    )
    text = result.output.decode()
    assert "netG = G().to(device)\nnetG = dp.distributed_model(netG)\n" in text
    assert "netD = D().to(device)\nnetD = dp.distributed_model(netD)\n" in text
    assert len(findings_of(result, "distributed-model", "change")) == 2


def test_a_model_built_in_another_function_is_declined():
    result = convert_text(
        """
        import torch

        def fit(model, data):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in data:
                model(x).sum().backward()
                optimizer.step()
        """
    )
    [finding] = findings_of(result, "distributed-model", "declined")
    assert "model = dp.distributed_model(model)" in finding.fix
    assert "distributed_model" not in result.output.decode()


def test_a_model_updated_by_hand_is_found_through_its_parameters():
    result = convert_text(
        """
        import torch
        model = Net()

        def train():
            model(x).sum().backward()
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-0.1)
        """
    )
    assert "model = Net()\nmodel = dp.distributed_model(model)\n" in result.output.decode()


def test_a_model_held_in_an_attribute_is_declined():
    result = convert_text(
        """
        import torch

        class Trainer:
            def setup(self):
                self.model = Net()
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def step(self, x):
                self.model(x).sum().backward()
                self.opt.step()
        """
    )
    text = result.output.decode()
    assert "self = dp" not in text and "distributed_model" not in text
    [finding] = findings_of(result, "distributed-model", "declined")
    assert "self.model = dp.distributed_model(self.model)" in finding.fix


def test_model_built_in_the_main_block_is_wrapped_there_before_training():
    # issue 8, defect 1: the wrap used to land at the end of the file, after the training had run
    assert_converts(
        """
        import torch
        if __name__ == "__main__":
            model = torch.nn.Linear(2, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(3):
                opt.zero_grad(); model(torch.ones(4, 2)).sum().backward(); opt.step()
        """,
        """
        import torch
        import dpmigrate.runtime.torch as dp

        if __name__ == "__main__":
            dp.init()
            model = torch.nn.Linear(2, 1)
            model = dp.distributed_model(model)
            opt = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
            for step in range(3):
                opt.zero_grad(); model(torch.ones(4, 2)).sum().backward(); opt.step()
        """,
    )


def test_model_built_in_a_with_block_inside_main_is_wrapped_inside_it():
    result = convert_text(
        """
        import torch

        def main():
            with torch.autograd.detect_anomaly():
                model = torch.nn.Linear(2, 1)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                opt.zero_grad(); model(torch.ones(4, 2)).sum().backward(); opt.step()

        if __name__ == "__main__":
            main()
        """
    )
    lines = result.output.decode().splitlines()
    assert lines.index("        model = dp.distributed_model(model)") == lines.index("        model = torch.nn.Linear(2, 1)") + 1


def test_model_built_and_trained_afresh_in_each_turn_of_a_repeat_loop_is_wrapped_in_each_turn():
    """``for trial in range(2):`` / a literal list: every rank runs as many turns (an MLP homework trained five
    fresh models and kept the best one: audit round M); the wrap lands in the turn, after the model is built."""
    for loop in ("for trial in range(2):", "for lr in [0.1, 0.01]:"):
        result = convert_text(
            f"""
            import torch
            {loop}
                model = torch.nn.Linear(2, 1)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                opt.zero_grad(); model(torch.ones(4, 2)).sum().backward(); opt.step()
            """
        )
        lines = result.output.decode().splitlines()
        assert lines.index("    model = dp.distributed_model(model)") == lines.index("    model = torch.nn.Linear(2, 1)") + 1
        assert not findings_of(result, "distributed-model", "declined")


def test_model_built_and_trained_inside_another_loop_is_declined_not_wrapped_after_it():
    for loop in ("for trial in trials():", "while budget_left():", "for trial in range(2):  # (with an else)"):
        source = "\n".join([
            "import torch", loop,
            "    model = torch.nn.Linear(2, 1)",
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)",
            "    opt.zero_grad(); model(torch.ones(4, 2)).sum().backward(); opt.step()",
            *(["else:", "    pass"] if "else" in loop else []), ""])
        result = convert_text(source)
        assert "distributed_model" not in result.output.decode()
        declined = findings_of(result, "distributed-model", "declined")
        assert len(declined) == 1 and "inside one block" in declined[0].message


def test_a_model_trained_by_lbfgs_is_left_to_the_distributed_optimizer():
    result = convert_text(
        """
        import torch

        def main():
            model = torch.nn.Linear(2, 1)
            opt = torch.optim.LBFGS(model.parameters(), lr=0.5)
            for step in range(3):
                def closure():
                    opt.zero_grad()
                    loss = model(torch.ones(4, 2)).pow(2).mean()
                    loss.backward()
                    return loss
                opt.step(closure)

        if __name__ == "__main__":
            main()
        """
    )
    converted = result.output.decode()
    assert "dp.distributed_model" not in converted
    assert "opt = dp.distributed_optimizer(torch.optim.LBFGS(model.parameters(), lr=0.5))" in converted
    [note] = findings_of(result, "distributed-model", "note")
    assert "closure optimizer (LBFGS)" in note.message


def test_a_model_returned_by_a_factory_is_wrapped_after_the_caller_moves_it_to_its_device():
    # issue 8, defect 5: it used to be wrapped inside the factory, on the CPU, before the caller's .to("cuda")
    result = convert_text(
        """
        import torch

        def load_train_objs():
            model = torch.nn.Linear(2, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            return model, optimizer

        def main():
            net, opt = load_train_objs()
            net = net.to("cuda")
            for x in data:
                opt.zero_grad(); net(x).sum().backward(); opt.step()

        if __name__ == "__main__":
            main()
        """
    )
    lines = result.output.decode().splitlines()
    assert "    model = dp.distributed_model(model)" not in lines
    assert lines.index("    net = dp.distributed_model(net)") == lines.index("    net = net.to(dp.device())") + 1


def test_a_factory_called_twice_is_declined():
    result = convert_text(
        """
        import torch

        def build():
            model = torch.nn.Linear(2, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            return model, opt

        def main():
            a, opt_a = build()
            b, opt_b = build()
            for x in data:
                opt_a.zero_grad(); a(x).sum().backward(); opt_a.step()

        main()
        """
    )
    assert "distributed_model" not in result.output.decode()
    assert findings_of(result, "distributed-model", "declined")
