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
        from torch import nn
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
