"""distributed-model follows bindings, not names (issue 22): every construction an optimizer trains is wrapped.

A model rebuilt under the same name, and a model handed to the function that trains it, were found by name: the
second construction was left unwrapped (torch's runtime then averaged its parameters as unowned ones, so the
training was right but the report named one model), and a parameter was declined as built elsewhere.
"""

from rule_testing import assert_converts, findings_of

WRAPPED = "after its set-up: DDP averages gradients across ranks"


def _model_findings(result) -> list[tuple[int, str, str]]:
    return [(f.line, f.severity, f.message) for f in findings_of(result, "distributed-model")]


def test_a_model_rebuilt_under_the_same_name_is_wrapped_at_each_construction():
    result = assert_converts(
        """
        import torch
        from torch import nn
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=32, shuffle=True)

        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()

        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        """,
        """
        import torch
        from torch import nn
        from torch.utils.data import DataLoader
        import dpmigrate.runtime.torch as dp

        dp.init()
        loader = dp.distributed_loader(DataLoader(dataset, batch_size=32, shuffle=True))

        model = nn.Linear(4, 1)
        model = dp.distributed_model(model)
        optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()

        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        model = dp.distributed_model(model)
        optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        """,
    )
    assert _model_findings(result) == [
        (8, "change", f"model = dp.distributed_model(model) {WRAPPED}"),
        (15, "change", f"model = dp.distributed_model(model) {WRAPPED}"),
    ]
    assert not [f for f in result.findings if f.severity == "declined"]


def test_a_model_passed_to_the_function_that_trains_it_is_wrapped_where_each_caller_builds_it():
    result = assert_converts(
        """
        import torch
        from torch import nn
        from torch.utils.data import DataLoader


        def fit(net, loader):
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(net(x), y).backward()
                optimizer.step()


        def main():
            loader = DataLoader(dataset, batch_size=32, shuffle=True)
            small = nn.Linear(4, 1)
            fit(small, loader)
            wide = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
            fit(wide, loader)


        if __name__ == "__main__":
            main()
        """,
        """
        import torch
        from torch import nn
        from torch.utils.data import DataLoader
        import dpmigrate.runtime.torch as dp


        def fit(net, loader):
            optimizer = dp.distributed_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(net(x), y).backward()
                optimizer.step()


        def main():
            dp.init()
            loader = dp.distributed_loader(DataLoader(dataset, batch_size=32, shuffle=True))
            small = nn.Linear(4, 1)
            small = dp.distributed_model(small)
            fit(small, loader)
            wide = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
            wide = dp.distributed_model(wide)
            fit(wide, loader)


        if __name__ == "__main__":
            main()
        """,
    )
    assert _model_findings(result) == [
        (17, "change", f"small = dp.distributed_model(small) {WRAPPED}"),
        (19, "change", f"wide = dp.distributed_model(wide) {WRAPPED}"),
    ]
    assert not [f for f in result.findings if f.severity == "declined"]


def test_a_model_moved_to_its_device_under_the_same_name_is_one_construction_wrapped_once():
    result = assert_converts(
        """
        import torch

        model = Net()
        model = model.to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in data:
            model(x).sum().backward()
            optimizer.step()
        """,
        """
        import torch
        import dpmigrate.runtime.torch as dp

        dp.init()
        model = Net()
        model = model.to(device)
        model = dp.distributed_model(model)
        optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
        for x in data:
            model(x).sum().backward()
            optimizer.step()
        """,
    )
    assert _model_findings(result) == [(5, "change", f"model = dp.distributed_model(model) {WRAPPED}")]


def test_a_model_a_caller_builds_in_the_call_itself_is_still_declined():
    result = assert_converts(
        """
        import torch


        def fit(net):
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
            for x in data:
                net(x).sum().backward()
                optimizer.step()


        fit(Net())
        """,
        """
        import torch
        import dpmigrate.runtime.torch as dp


        dp.init()
        def fit(net):
            optimizer = dp.distributed_optimizer(torch.optim.SGD(net.parameters(), lr=0.1))
            for x in data:
                net(x).sum().backward()
                optimizer.step()


        fit(Net())
        """,
    )
    assert _model_findings(result) == [(6, "declined", (
        "`net` is built outside the function that trains it; cannot tell where to wrap it"))]
