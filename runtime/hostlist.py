"""Expand Slurm's compressed host and task lists, without calling ``scontrol``.

Slurm hands every task its job's nodes as a *hostlist* (``node[01-04,07],gpu5``) and the tasks per
node as a run-length list (``4(x2),3``). The Slurm reader needs the first host (rank 0 runs there, so
it is the rendezvous address), the number of nodes, and this node's task count. ``scontrol show
hostnames`` would do it, but it is not on the PATH inside every container, and spawning it from every
rank at start-up is slow; the syntax is small enough to parse here.

Errors are plain ``ValueError`` with the offending text; the Slurm reader adds the variable's name.
"""

from __future__ import annotations

import re

_TASKS = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def expand_hostlist(text: str) -> list[str]:
    """``"node[01-02,07],gpu5"`` -> ``["node01", "node02", "node07", "gpu5"]``, in Slurm's order.

    Ranges keep the zero padding of their lower bound (``[08-10]`` -> ``08, 09, 10``). Several
    bracket groups in one name expand as a product, the leftmost group varying slowest
    (``rack[1-2]-n[3-4]`` -> ``rack1-n3, rack1-n4, rack2-n3, rack2-n4``).
    """
    hosts: list[str] = []
    for item in _split_outside_brackets(text):
        hosts.extend(_expand_name(item, text))
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """``"2(x3),1"`` -> ``[2, 2, 2, 1]``: one count per node, in node order."""
    counts: list[int] = []
    for item in text.split(","):
        match = _TASKS.fullmatch(item.strip())
        if match is None:
            raise ValueError(f"{item.strip()!r} is not a task count like '4' or '4(x2)'")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _split_outside_brackets(text: str) -> list[str]:
    items, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth < 0 or depth > 1:
            raise ValueError(f"unbalanced or nested '[' ']' in {text!r}")
        if char == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise ValueError(f"'[' without a closing ']' in {text!r}")
    items.append("".join(current).strip())
    if any(not item for item in items):
        raise ValueError(f"empty host name in {text!r}")
    return items


def _expand_name(name: str, text: str) -> list[str]:
    start = name.find("[")
    if start < 0:
        return [name]
    end = name.index("]", start)
    prefix, body, rest = name[:start], name[start + 1 : end], name[end + 1 :]
    tails = _expand_name(rest, text)
    return [prefix + number + tail for number in _expand_ranges(body, text) for tail in tails]


def _expand_ranges(body: str, text: str) -> list[str]:
    numbers: list[str] = []
    for part in body.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"{part.strip()!r} in {text!r} is not a number or a range like 01-04")
        if not dash:
            numbers.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"range {part.strip()!r} in {text!r} runs backwards")
        numbers.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return numbers
