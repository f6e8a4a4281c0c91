"""``dpmigrate verify``: the equivalence oracle as a command a user runs on their own script.

The original on one process with global batch B against the conversion on N processes with B/N each:
after every one of K optimizer steps, the parameters must agree (to a tolerance) and the ranks must
have read disjoint shares of the original's batch. :mod:`.cli` runs it, :mod:`.harness` records inside
the runs, :mod:`.compare` explains, :mod:`.report` says it. Importing this package loads no framework.
"""


def main(argv=None) -> int:
    from .cli import main as run

    return run(argv)
