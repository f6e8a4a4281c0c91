"""Work data parallelism cannot split is converted safely and said plainly (issue 8): full batch, RL, hand batches."""

from rule_testing import convert_text, findings_of


def _note(source: str) -> str:
    [note] = findings_of(convert_text(source), "manual-batching", "note")
    return note.message


def test_full_batch_training_is_said_to_gain_nothing():
    message = _note(
        """
        import torch
        graph_x, graph_y = torch.randn(50, 4), torch.randn(50, 1)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(10):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(graph_x), graph_y).backward()
            opt.step()
        """
    )
    assert "whole data at every step (full-batch training)" in message and "no speed-up" in message


def test_reinforcement_learning_says_each_rank_plays_its_own_episodes():
    message = _note(
        """
        import gymnasium as gym
        import torch
        env = gym.make("CartPole-v1")
        policy = torch.nn.Linear(4, 2)
        opt = torch.optim.Adam(policy.parameters())
        for episode in range(10):
            state, _ = env.reset(seed=0)
            opt.zero_grad()
            policy(torch.as_tensor(state)).sum().backward()
            opt.step()
        """
    )
    assert "every rank plays its own" in message


def test_slicing_by_hand_keeps_the_manual_batching_note():
    message = _note(
        """
        import torch
        data = torch.randn(64, 4)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(0, 64, 8):
            opt.zero_grad()
            model(data[i:i + 8]).sum().backward()
            opt.step()
        """
    )
    assert "batches its data by hand" in message


def test_windows_yielded_by_a_method_of_the_file_are_hand_batches_not_full_batch_training():
    message = _note(
        """
        import torch

        class Stream:
            def __init__(self, ids):
                self.rows = ids.view(4, -1)

            def windows(self, width):
                for left in range(0, self.rows.shape[1] - 1, width):
                    yield self.rows[:, left:left + width], self.rows[:, left + 1:left + 1 + width]

        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        stream = Stream(torch.arange(400.0))
        for epoch in range(3):
            for x, y in stream.windows(8):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
        """
    )
    assert "batches its data by hand" in message and "full-batch" not in message


def test_data_drawn_through_a_sampler_a_factory_made_is_fresh_per_rank_not_full_batch():
    # torch audit D2: the note said "full batch, every rank the same gradients"; the global batch was N x (204 vs 102)
    from rule_testing import convert_text, findings_of

    result = convert_text("""
        import numpy as np
        import torch

        def make_sampler(mu, s):
            return lambda n: torch.tensor(np.random.normal(mu, s, (n, 1)), dtype=torch.float32)

        sample = make_sampler(3.0, 1.0)
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(200):
            x = sample(32)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    """)
    [note] = findings_of(result, "manual-batching", "note")
    # NumPy's generator: dp.init() gives every rank rank 0's state (issue 19, round F), so every rank draws the
    # original's batch; with torch's own generator each rank draws its own (tests/test_paddle_loops.py)
    assert "draws its data at random at every step with NumPy's generator, which dp.init() makes alike" in note.message
    assert "full-batch" not in note.message
    torch_drawn = convert_text("""
        import torch
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(200):
            x = torch.randn(32, 1)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    """)
    [note] = findings_of(torch_drawn, "manual-batching", "note")
    assert "draws its data at random at every step, unseeded" in note.message
