"""Compatibility only: the private module paths PyTorch Monarch's own examples and tests import.

``monarch._src.actor.telemetry``, ``.actor_mesh``, ``.mock``, ``.host_mesh``, ``.proc_mesh``,
``.endpoint``, ``.future``, ``.bootstrap``, ``.concurrent`` and ``monarch._src.job.job`` /
``.process`` give the same names as Monarch's, each an alias of monarch's public object (or, for
``mock.patch_actor``, of ``monarch.actor._mock``; ``proc_mesh.register_proc_mesh_spawn_callback``
is real).  Names of Monarch's runtime internals that its tests import beside the API they test
(here and in ``monarch._rust_bindings``, ``monarch.tools``) are placeholders: the module imports,
and using one raises ``NotImplementedError`` (``_placeholder``).  New code should import from
``monarch.actor`` and ``monarch.job``.
"""
