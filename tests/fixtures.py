"""Fixtures shared by the packages whose tests run actors in this process.

A package opts in with ``from tests.fixtures import client, _every_test_cleans_up``
in its conftest; the client is then package-scoped there.
"""

import pytest

from tests.helpers import start_client, stop_client


@pytest.fixture(scope="package", autouse=True)
def client():
    """This process's monarch runtime and private host agent, for every test of the package."""
    rt = start_client()
    yield rt
    stop_client()


@pytest.fixture(autouse=True)
def _every_test_cleans_up(no_leaked_processes):
    yield
