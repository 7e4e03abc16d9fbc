"""Compatibility only: a placeholder for Monarch's ``monarch.tools.config.Config`` (see ``monarch.tools``)."""

from monarch._src._placeholder import placeholder

Config = placeholder(__name__, "Config")
