from tests.fixtures import _every_test_cleans_up, client  # noqa: F401  (shared fixtures)
