"""init-runtime: dp.init() at the start of the entry point of a training script, after the
arguments are parsed."""

from rule_testing import assert_converts, assert_unchanged, convert_text, findings_of


def test_init_goes_after_parse_args_in_the_function_the_main_guard_calls():
    assert_converts(
        """
        import argparse
        import torch

        def main():
            parser = argparse.ArgumentParser()
            args = parser.parse_args()
            torch.manual_seed(0)
            loss.backward()

        if __name__ == "__main__":
            main()
        """,
        """
        import argparse
        import torch
        import dpmigrate.runtime.torch as dp

        def main():
            parser = argparse.ArgumentParser()
            args = parser.parse_args()
            dp.init()
            torch.manual_seed(0)
            loss.backward()

        if __name__ == "__main__":
            main()
        """,
    )


def test_init_goes_first_in_an_entry_function_that_parses_nothing():
    assert_converts(
        '''
        import torch

        def main(seed):
            """Train."""
            torch.manual_seed(seed)
            loss.backward()

        if __name__ == "__main__":
            main(0)
        ''',
        '''
        import torch
        import dpmigrate.runtime.torch as dp

        def main(seed):
            """Train."""
            dp.init()
            torch.manual_seed(seed)
            loss.backward()

        if __name__ == "__main__":
            main(0)
        ''',
    )


def test_init_goes_after_parse_args_in_the_main_guard_itself():
    assert_converts(
        """
        import argparse
        import torch

        parser = argparse.ArgumentParser()

        if __name__ == "__main__":
            args = parser.parse_args()
            torch.manual_seed(0)
            loss.backward()
        """,
        """
        import argparse
        import torch
        import dpmigrate.runtime.torch as dp

        parser = argparse.ArgumentParser()

        if __name__ == "__main__":
            args = parser.parse_args()
            dp.init()
            torch.manual_seed(0)
            loss.backward()
        """,
    )


def test_init_goes_after_the_imports_of_a_script_without_arguments():
    assert_converts(
        """
        import torch

        torch.manual_seed(0)
        loss.backward()
        """,
        """
        import torch
        import dpmigrate.runtime.torch as dp

        dp.init()
        torch.manual_seed(0)
        loss.backward()
        """,
    )


def test_init_is_reported_where_it_is_inserted():
    result = convert_text(
        """
        import argparse, torch
        args = argparse.ArgumentParser().parse_args()
        loss.backward()
        """
    )
    [finding] = findings_of(result, "init-runtime")
    assert (finding.line, finding.col, finding.severity) == (3, 1, "change")  # line 1 is blank


def test_a_module_that_trains_nothing_gets_no_init():
    assert_unchanged(
        """
        import torch
        from torch import nn

        class Net(nn.Module):
            def forward(self, x):
                print(x.shape)
                return x
        """
    )


def test_a_script_that_parses_at_the_top_is_initialised_there_not_in_a_step_function():
    result = convert_text(
        """
        import argparse, torch
        args = argparse.ArgumentParser().parse_args()

        def train(epoch):
            loss.backward()

        if __name__ == "__main__":
            for epoch in range(3):
                train(epoch)
        """
    )
    text = result.output.decode()
    assert "args = argparse.ArgumentParser().parse_args()\ndp.init()\n" in text
    assert text.count("dp.init()") == 1


def test_arguments_parsed_straight_into_the_entry_call_start_the_runtime_at_its_top_not_after_it():
    # `train(parser.parse_args())` is the whole run: dp.init() after that line would come after training
    result = convert_text(
        '''
        import argparse
        import torch

        def train(opts):
            """Fit."""
            torch.manual_seed(opts.seed)
            loss.backward()

        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--seed", type=int, default=0)
            train(parser.parse_args())
        '''
    )
    text = result.output.decode()
    assert '    """Fit."""\n    dp.init()\n    torch.manual_seed(opts.seed)\n' in text
    assert text.count("dp.init()") == 1
    [finding] = findings_of(result, "init-runtime")
    assert (finding.line, finding.severity) == (7, "change")
    assert "after the arguments are parsed" in finding.message
