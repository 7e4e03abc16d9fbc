"""PyTorch Monarch's ``monarch.tools.config``: what ``monarch.tools.commands.create`` submits.

    from monarch.tools.config import Config
    from monarch.tools.config.workspace import Workspace

    config = Config(scheduler="slurm", scheduler_args={"partition": "debug"},
                    workspace=Workspace(dirs=["~/src/proj"]), appdef=my_torchx_appdef)

``scheduler`` is one of ``defaults.scheduler_factories()`` (TorchX's), ``scheduler_args`` its run
options (``torchx runopts SCHEDULER``), ``appdef`` the TorchX ``AppDef`` to run, and ``dryrun``
asks ``create`` for the request instead of submitting it.  TorchX is imported only when an
``appdef`` is made.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from monarch.tools.config.workspace import Workspace

if TYPE_CHECKING:
    from torchx.specs import AppDef

__all__ = ["Config", "NOT_SET", "Workspace"]

#: The value of a setting nobody gave (the scheduler's, the appdef's name).
NOT_SET: str = "__NOT_SET__"


def _empty_appdef() -> "AppDef":
    from torchx.specs import AppDef

    return AppDef(name=NOT_SET)


@dataclass
class Config:
    """Where and what ``create`` submits: ``scheduler``, its ``scheduler_args``, the ``workspace``
    taken along, ``dryrun``, and the TorchX ``appdef``."""

    scheduler: str = NOT_SET
    scheduler_args: dict[str, Any] = field(default_factory=dict)
    workspace: Workspace = field(default_factory=Workspace.null)
    dryrun: bool = False
    appdef: "AppDef" = field(default_factory=_empty_appdef)

    def __post_init__(self) -> None:
        # Older programs give a folder (str) or None; they still work, with Monarch's FutureWarning.
        if self.workspace is None or self.workspace == "":
            warnings.warn("Config(workspace=None) is deprecated: use workspace=Workspace.null() "
                          "(monarch.tools.config.workspace)", FutureWarning, stacklevel=3)
            self.workspace = Workspace.null()
        elif isinstance(self.workspace, str):
            warnings.warn(f"Config(workspace={self.workspace!r}) is deprecated: use "
                          f"workspace=Workspace(dirs={{{self.workspace!r}: ''}})", FutureWarning, stacklevel=3)
            # A folder given alone was copied to the root of $WORKSPACE_DIR.
            self.workspace = Workspace(dirs={self.workspace: ""})
