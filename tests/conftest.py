"""Shared pytest options (``--update-fixtures`` rewrites the expected outputs of the golden fixtures) and the
multinode tests' ``nodes`` fixture (skipped where namespaces cannot be made, except under ``.ci/run`` as root
with iproute2, where a skip would hide a failure)."""

from __future__ import annotations

import os

import pytest
from netns import NamespacesUnavailable, TwoNodes

REQUIRE_NAMESPACES = "DPMIGRATE_REQUIRE_NAMESPACES"  # set by .ci/run where the multinode tests can run


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-fixtures",
        action="store_true",
        default=False,
        help="rewrite fixtures/*/*/after.py and findings.txt from the current converter (review the diff)",
    )


@pytest.fixture
def update_fixtures(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-fixtures"))


@pytest.fixture
def nodes():
    """Two network namespaces joined by a veth pair (tests/netns.py), deleted after the test even on failure."""
    try:
        two = TwoNodes()
    except NamespacesUnavailable as e:
        if os.environ.get(REQUIRE_NAMESPACES):  # CI (root, iproute2 installed): a skip would hide a failure
            pytest.fail(f"cannot create network namespaces, and {REQUIRE_NAMESPACES} is set: {e}")
        pytest.skip(f"cannot create network namespaces here: {e}")
    try:
        yield two
    finally:
        two.close()
