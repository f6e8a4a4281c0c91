"""same-random-inputs: noise drawn in training after a shared seed is the same on every rank (a GAN's noise)."""

from rule_testing import convert_text, findings_of

GAN = """
import torch
{seed}
generator = torch.nn.Linear(8, 2)
opt = torch.optim.Adam(generator.parameters())
for real in batches:
    opt.zero_grad()
    noise = torch.randn(len(real), 8)
    generator(noise).sum().backward()
    opt.step()
"""


def test_seeded_noise_in_the_training_loop_gets_a_note_with_the_fix():
    [note] = findings_of(convert_text(GAN.format(seed="torch.manual_seed(999)")), "same-random-inputs", "note")
    assert "identical on every rank" in note.message and "seed + dp.rank()" in note.fix


def test_unseeded_noise_is_left_alone():
    assert findings_of(convert_text(GAN.format(seed="")), "same-random-inputs") == []
