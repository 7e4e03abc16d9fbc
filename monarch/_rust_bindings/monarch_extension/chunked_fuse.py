"""Compatibility only: PyTorch Monarch's ``monarch._rust_bindings.monarch_extension.chunked_fuse``, the
FUSE filesystem of ``monarch.remotemount``.  Here it is ``monarch_rdmafs.blockfs`` (a mount process
per mount, blocks in shared memory); see :class:`monarch_rdmafs.blockmount.BlockMount`."""

from monarch_rdmafs.blockmount import BlockMount

#: Monarch's name for the handle of one mount: ``block_ptr``, ``receive_block``, ``refresh``, ``unmount``.
FuseMountHandle = BlockMount


def mount_chunked_fuse(metadata: "dict", total_size: int, mount_point: str, fault_callback: "object") -> BlockMount:
    """Mount ``metadata`` (a remotemount index) at ``mount_point`` with no block yet;
    ``fault_callback(block)`` (or None) hears of each block a read waits for.  ``RuntimeError`` if it
    cannot mount."""
    return BlockMount(metadata, total_size, mount_point, fault_callback)
