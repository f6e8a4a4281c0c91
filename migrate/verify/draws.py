"""Whether the ranks of the conversion drew the same random numbers during training.

Why: per-step randomness (a GAN's latent vectors and random labels, a gradient penalty's mixing weights, noise,
masks, augmentation) must differ per rank: a step then averages N ranks' draws, as the original drew one batch's.
When every rank draws the same numbers (a script seeded alike on every rank, or a runtime that copied rank 0's
generator state to all of them), the generator learns from one rank's noise N times over, and the weights may
still look close (issue 32, blind spot 1; issue 31 measured it on four real GAN scripts).

The harness keeps, for each step in which a global generator advanced (Python's ``random``, NumPy's, the
framework's), a digest of that generator's state after the step (``Record.random_trace``). Two ranks whose same
generator advanced in a step and ended it in the same state drew the same numbers in it.
"""

from __future__ import annotations

from . import dumps


def same_draws(one: dumps.Record, ranks: list[dumps.Record]) -> dict[str, list[int]]:
    """For each generator, the steps (from the second: the first is not told apart from building the model) in which
    the original drew from it and every rank drew the same numbers from it; only for a generator the original draws
    from in at least half of its steps (noise, masks, labels drawn per step). Occasional draws, a shuffle at the start
    of each epoch, must be alike on every rank when the ranks cut their batches from one permutation
    (``fixtures/torch/shuffled_hand_batches``: the conversion shares the generator's state for that)."""
    same: dict[str, list[int]] = {}
    if len(ranks) < 2:
        return same
    span = range(2, max(one.steps, 2) + 1)
    for generator in sorted({g for t in one.random_trace.values() for g in t}):
        drawn = [s for s in span if generator in one.random_trace.get(str(s), {})]
        if len(drawn) < 2 or 2 * len(drawn) < len(span):
            continue
        for step in drawn:
            states = [r.random_trace.get(str(step), {}).get(generator) for r in ranks]
            if None not in states and len(set(states)) == 1:
                same.setdefault(generator, []).append(step)
    return {g: steps for g, steps in same.items() if len(steps) >= 2}


def message(same: dict[str, list[int]], world_size: int) -> str:
    where = "; ".join(f"{generator}'s generator at step{'s' * (len(steps) > 1)} {', '.join(map(str, steps[:5]))}"
                      f"{' ...' if len(steps) > 5 else ''}" for generator, steps in same.items())
    return (f"every rank drew the same random numbers during training ({where}): the noise, random labels or masks "
            f"of one rank repeat on the other {world_size - 1}, so a step averages {world_size} copies of one rank's "
            "draws where the original drew a whole batch's. Draws made during training must differ per rank (rank 0 "
            "keeping the original's): seed each rank's generator apart once training starts (seed + dp.rank()), while "
            "data built at random before training stays alike")
