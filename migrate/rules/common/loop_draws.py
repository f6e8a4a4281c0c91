"""What a hand-fed training loop calls to get its data: the scopes where its per-step random draws would be.

Shared by the torch and Paddle manual-batching rules. A loop that reads no DataLoader may draw its batches at
random at every step, in its own body or in a function of the file it calls, directly (``x = make_batch()``) or
through a callable a factory of the file returned (``reader = reader_creator(3)`` then ``for x in reader():``,
the Paddle image_search tutorial's pairs; ``sample = make_sampler(3.0, 1.0)``). Each rank then draws its own
batches: data parallelism with N times the batch, not a split of the original's, which the report must say.
"""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule


def loop_data_scopes(rule: Rule, loop: cst.CSTNode) -> list[cst.CSTNode]:
    """The loop's body (its iterable too), the file's functions it calls, and those that made the callables it calls
    (with the functions nested in them: a generator a factory returns)."""
    functions = rule.q.module_functions()
    called = rule.q.called_names(loop)
    scopes: list[cst.CSTNode] = [loop.body]
    if isinstance(loop, cst.For):
        scopes.append(loop.iter)
    scopes += [functions[n] for n in called if n in functions]
    for assign in rule.q.index.of_type(rule.ctx.module, cst.Assign):
        value = assign.value
        if (len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
                and assign.targets[0].target.value in called - set(functions) and isinstance(value, cst.Call)
                and isinstance(value.func, cst.Name) and value.func.value in functions):
            scopes.append(functions[value.func.value])
    return scopes

