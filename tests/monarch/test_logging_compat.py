"""monarch._src.actor.logging (compatibility only): Monarch's LoggingManager drives a proc mesh's own log
forwarding through LoggingMeshClient; get_active_proc_meshes lists this process's unstopped proc meshes."""

import asyncio
import logging

import pytest

from monarch._src.actor import logging as compat_logging
from monarch._src.actor.proc_mesh import get_active_proc_meshes
from monarch.actor import this_host


def test_active_proc_meshes_are_the_unstopped_ones_and_the_manager_drives_the_mesh(no_leaked_processes):
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        assert pm in get_active_proc_meshes()
        manager = compat_logging.LoggingManager()
        assert manager._logging_mesh_client is None
        manager.flush()  # nothing to flush yet: a no-op
        asyncio.run(manager.init(pm, stream_to_client=False))
        client = manager._logging_mesh_client
        assert client is not None and client._proc_mesh is pm
        asyncio.run(manager.init(pm, stream_to_client=True))  # once only
        assert manager._logging_mesh_client is client
        asyncio.run(manager.logging_option(stream_to_client=False, aggregate_window_sec=None, level=logging.WARNING))
        with pytest.raises(ValueError, match="Invalid logging level"):
            asyncio.run(manager.logging_option(stream_to_client=False, aggregate_window_sec=None, level=-1))
        assert manager.enable_fd_capture_if_in_ipython() is None
        compat_logging.flush_all_proc_mesh_logs()
        manager.flush()
    finally:
        pm.stop().get()
    assert pm not in get_active_proc_meshes()


def test_logging_option_before_init_says_so():
    with pytest.raises(RuntimeError, match="before init"):
        asyncio.run(compat_logging.LoggingManager().logging_option())
