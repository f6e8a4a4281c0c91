"""same-random-inputs: noise drawn in training after a shared seed, each rank's own in a loop a sharded loader feeds.

Issue 31, shape 1: with every rank seeded alike (and ``dp.init()`` sharing Python's and NumPy's states), a seeded GAN
drew the same latent vectors on every rank, and the note said so with a fix for the user to apply. The runtime now
parts the ranks' streams at a sharded training loader's first pass (``runtime/common.TrainingDraws``; executed in
``tests/test_host_generators.py``), so in a loop such a loader feeds the note says what happens instead: each rank
draws its own, rank 0 the original's, and no fix is asked for. In a loop no sharded loader feeds, the streams stay
alike, and the note keeps saying so, with the fix.
"""

from rule_testing import convert_text, findings_of

GAN = """
import torch
from torch.utils.data import DataLoader
{seed}
generator = torch.nn.Linear(8, 2)
opt = torch.optim.Adam(generator.parameters())
for real in DataLoader(torch.randn(64, 2), batch_size=16, shuffle=True):
    opt.zero_grad()
    noise = torch.randn(len(real), 8)
    generator(noise).sum().backward()
    opt.step()
"""


def test_seeded_noise_in_a_loop_fed_by_a_dataloader_is_noted_as_each_ranks_own():
    [note] = findings_of(convert_text(GAN.format(seed="torch.manual_seed(999)")), "same-random-inputs", "note")
    assert "each rank draws its own numbers (rank 0 the original's)" in note.message, note.message
    assert "at the sharded loader's first pass" in note.message
    assert "identical" not in note.message and not note.fix


def test_the_note_comes_for_any_seed_of_the_script_numpy_s_too():
    result = convert_text("import numpy as np\n" + GAN.format(seed="np.random.seed(3)"))
    assert findings_of(result, "same-random-inputs", "note")


def test_unseeded_noise_is_left_alone():
    assert findings_of(convert_text(GAN.format(seed="")), "same-random-inputs") == []


HAND_CUT = """
import torch
torch.manual_seed(999)
data = torch.randn(64, 2)
generator = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(generator.parameters(), lr=0.1)
for epoch in range(2):
    for k in torch.randperm(4).tolist():
        real = data[16 * k:16 * k + 16]
        opt.zero_grad()
        noise = torch.randn(len(real), 8)
        generator(noise).sum().backward()
        opt.step()
"""


def test_a_loop_no_sharded_loader_feeds_draws_alike_and_the_note_gives_the_fix():
    """Hand-cut batches: every rank reads all of them, nothing parts the streams, every rank draws the same noise."""
    [note] = findings_of(convert_text(HAND_CUT), "same-random-inputs", "note")
    assert "identical on every rank" in note.message and "seed + dp.rank()" in note.fix


def test_a_draw_in_a_loop_nested_in_the_loader_loop_is_each_ranks_own():
    nested = GAN.format(seed="torch.manual_seed(1)").replace(
        "    noise = torch.randn(len(real), 8)\n", "    for _ in range(2):\n        noise = torch.randn(len(real), 8)\n")
    [note] = findings_of(convert_text(nested), "same-random-inputs", "note")
    assert "each rank draws its own numbers" in note.message, note.message


def test_a_loader_with_a_sampler_of_its_own_is_not_sharded_so_draws_stay_alike():
    own = GAN.format(seed="torch.manual_seed(1)").replace("shuffle=True", "sampler=range(64)")
    notes = findings_of(convert_text(own), "same-random-inputs", "note")
    assert [n for n in notes if "identical on every rank" in n.message], notes
