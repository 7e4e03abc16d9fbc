"""Compatibility only: Monarch's ``monarch._src.actor.host_mesh`` names, aliases of ``monarch.actor``'s."""

from monarch.actor import HostMesh, default_bootstrap_cmd, hosts_from_config, this_host, this_proc  # noqa: F401
from monarch._src._placeholder import placeholder_function

_spawn_admin = placeholder_function(__name__, "_spawn_admin", "a job's admin service is JobTrait.enable_admin()")
