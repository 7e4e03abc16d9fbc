"""A user's SQL on the host agents has a memory limit (issue #24, finding 7): a query over it fails
in one line, and the agents keep answering."""

from __future__ import annotations

import pytest

from tests.cli.conftest import monarch

pytestmark = pytest.mark.timeout(240)

SORT_BIG = ("SELECT host, s FROM (SELECT host, repeat(host, 2000) || CAST(v AS VARCHAR) AS s "
            "FROM hosts CROSS JOIN generate_series(1, 100000) t(v)) ORDER BY s DESC")


def test_a_query_over_the_memory_limit_fails_in_one_line(tmp_path):
    env = {"MONARCH_TELEMETRY_MEMORY_BYTES": str(32 << 20)}
    assert monarch("serve", cwd=tmp_path, env=env).returncode == 0
    try:
        r = monarch("query", SORT_BIG, cwd=tmp_path, env=env, timeout=120)
        assert r.returncode != 0
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert "32 MiB a telemetry query may use" in lines[0], r.stderr
        assert monarch("query", "SELECT host FROM hosts", cwd=tmp_path, env=env).returncode == 0
    finally:
        monarch("stop", "--force", cwd=tmp_path, timeout=60)
