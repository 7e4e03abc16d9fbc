"""Compatibility only: Monarch's ``monarch._src.job.process.ProcessJob``, alias of ``monarch.job``'s."""

from monarch.job import ProcessJob  # noqa: F401
