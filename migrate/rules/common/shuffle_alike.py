"""Shuffles a hand-batching training loop makes with an unseeded generator, made alike on every rank.

Why: a script that cuts its batches by hand (``np.random.shuffle(train_data)`` each epoch, then
``train_data[k:k + B]``) has no DataLoader to shard, so every rank reads all the data. That is correct (no
speed-up) only if every rank cuts the same batches; with an unseeded generator each rank shuffles its own
way, and each step averages N different batches: N times the batch, not the original's training, while the
report said "every rank reads all the data, which is correct" (measured with ``dpmigrate verify``: a 1.06x
update). Giving every rank rank 0's generator state just before the shuffle makes the ranks shuffle alike,
and rank 0 shuffle as the original does (its own state, unchanged); on one process ``dp.broadcast`` returns
its argument, so a plain run is the original's.

    np.random.shuffle(train_data)
->  np.random.set_state(dp.broadcast(np.random.get_state()))
    np.random.shuffle(train_data)

The same for ``np.random.permutation``, ``random.shuffle`` (``random.setstate``/``getstate``) and, for
torch, ``torch.randperm`` on the CPU generator (``torch.set_rng_state``/``get_rng_state``). A shuffle
called by a bare name (``from numpy.random import shuffle``), on a device's generator or of another
framework cannot be aligned this way: the caller declines it.
"""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule

# the shuffle's qualified name -> (the state getter and setter of its generator's module)
_GENERATORS = {
    "numpy.random.shuffle": ("get_state", "set_state"),
    "numpy.random.permutation": ("get_state", "set_state"),
    "random.shuffle": ("getstate", "setstate"),
    "torch.randperm": ("get_rng_state", "set_rng_state"),
}
SHUFFLES = frozenset(_GENERATORS)
_SEEDS = {  # what seeds each shuffle's generator (alike on every rank, when the file calls it)
    "numpy.random.shuffle": {"numpy.random.seed"},
    "numpy.random.permutation": {"numpy.random.seed"},
    "random.shuffle": {"random.seed"},
    "torch.randperm": {"torch.manual_seed", "torch.random.manual_seed"},
}


def shuffles_in(rule: Rule, loops: list[cst.CSTNode], names: frozenset[str] = SHUFFLES) -> list[cst.Call]:
    """The calls of ``names`` in ``loops`` (each once, in source order)."""
    found: dict[int, cst.Call] = {}
    for loop in loops:
        for call in rule.q.index.of_type(loop, cst.Call):
            if rule.q.is_call_to(call, names):
                found.setdefault(rule.q.index.position(call), call)
    return [found[k] for k in sorted(found)]


def unseeded(rule: Rule, calls: list[cst.Call]) -> list[cst.Call]:
    """Those of ``calls`` (draws of any generator) whose generator the file seeds nowhere: each rank draws its own.
    A draw that is not one of :data:`SHUFFLES` counts as unseeded unless NumPy's, Python's or the framework's
    generator is seeded (what the rules asked before)."""
    file_calls = rule.q.index.of_type(rule.ctx.module, cst.Call)
    everything = any(rule.q.is_call_to(c, rule.vocabulary.random_seeds_all) for c in file_calls)  # seed_everything
    seeded = {name for name, seeds in _SEEDS.items() if everything or any(rule.q.is_call_to(c, seeds) for c in file_calls)}
    any_seed = set().union(*_SEEDS.values()) | rule.vocabulary.random_seeds | rule.vocabulary.random_seeds_all
    seeded_at_all = any(rule.q.is_call_to(c, any_seed) for c in file_calls)
    return [c for c in calls if not (_name(rule, c) in seeded if _name(rule, c) else seeded_at_all)]


def _name(rule: Rule, call: cst.Call) -> str | None:
    found = rule.q.index.qualified_names_among(call.func, SHUFFLES)
    return next(iter(found)) if found else None


def alignable(rule: Rule, call: cst.Call) -> bool:
    """``module.shuffle(...)`` (the generator's module written before it) on the default generator."""
    return (_name(rule, call) is not None and isinstance(call.func, cst.Attribute) and rule.q.statement_of(call) is not None
            and not any(a.keyword is not None and a.keyword.value in ("device", "generator") for a in call.args))


def align(rule: Rule, calls: list[cst.Call]) -> None:
    """Insert, before each call's statement, the line that gives every rank rank 0's generator state."""
    done: set[int] = set()
    for call in calls:
        statement = rule.q.statement_of(call)
        if statement is None or id(statement) in done:
            continue
        done.add(id(statement))
        getter, setter = _GENERATORS[_name(rule, call)]
        module = rule.code(call.func.value)
        rule.ctx.plan.insert_before(statement, rule.statement(
            f"{module}.{setter}({{dp}}.broadcast({module}.{getter}()))\n"))
        rule.report(call, "change", f"`{rule.code(call)}` shuffles alike on every rank: {module}.{setter}(dp.broadcast("
                    f"{module}.{getter}())) first gives each rank rank 0's generator state, so the ranks cut the same "
                    "batches (rank 0's the original's)")
