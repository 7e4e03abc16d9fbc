"""Monarch's ``monarch.tools`` helpers a launcher script uses: the address of a host
(``monarch.tools.network``), its dot-directory and the active conda environment
(``monarch.tools.utils``, ``monarch.tools.config.environment``).  Runs unchanged on monarch and on
torchmonarch 0.7.0."""

import os
import stat
import sys
import tempfile

from monarch.tools.config.environment import CondaEnvironment
from monarch.tools.network import AddrType, get_ipaddr, get_sockaddr
from monarch.tools.utils import MONARCH_HOME, conda


def attempt(f):
    try:
        return f()
    except Exception as e:  # noqa: BLE001 - the type is what is printed
        return type(e).__name__


print("ipv4 literal", get_sockaddr("127.0.0.1", 8080), get_ipaddr("127.0.0.1", 8080))
print("ipv6 literal", get_sockaddr("::1", 8080), get_ipaddr("::1", 8080, AddrType.IPv6))
print("ipv4 asked of an ipv6 literal", attempt(lambda: get_ipaddr("::1", 80, AddrType.IPv4)))
print("link-local skipped", attempt(lambda: get_ipaddr("169.254.3.4", 80)), attempt(lambda: get_sockaddr("fe80::1", 80)))
print("this host resolves", bool(get_sockaddr(os.uname().nodename, 26600)))
print("types", [t.name for t in AddrType])

with tempfile.TemporaryDirectory() as d:
    os.environ["MONARCH_HOME"] = os.path.join(d, "home")
    out = MONARCH_HOME("conda-pack", "out")
    print("MONARCH_HOME", os.path.relpath(MONARCH_HOME(), d), os.path.relpath(out, d), out.is_dir(),
          stat.S_ISDIR(os.stat(out).st_mode))

os.environ.pop("CONDA_PREFIX", None)
print("no conda", conda.active_env_dir(), conda.active_env_name(), attempt(lambda: CondaEnvironment().conda_prefix))
os.environ["CONDA_PREFIX"] = "/opt/conda/envs/train-py3"
env = CondaEnvironment()
print("conda", conda.active_env_name(), env.conda_prefix, CondaEnvironment("/x").conda_prefix)
print("equal", env == CondaEnvironment(), env == CondaEnvironment("/opt/conda/envs/train-py3"), env == "x")
sys.stdout.flush()
print("done")
