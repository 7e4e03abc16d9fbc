"""Compatibility only: Monarch's ``monarch._src.actor.code_sync.auto_reload``, the objects of
``monarch.actor._auto_reload``."""

from monarch.actor._auto_reload import AutoReloader, Fingerprint, SysAuditHookGuard, SysAuditImportHook

__all__ = ["AutoReloader", "Fingerprint", "SysAuditHookGuard", "SysAuditImportHook"]
