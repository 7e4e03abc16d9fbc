"""``monarch.actor.config``: settings of the actor API in this process, as in Monarch.

``prefix_python_logs_with_actor``: log records made inside an actor start with
``[actor=NAME] `` (default True); set it to False in a process (e.g. in an actor's
``__init__``, or the client) to leave its records as they are.  The runtime settings
(timeouts) are ``monarch.config``'s.
"""

import importlib
import sys
import types

from monarch_agents import actor_logging


class _Config(types.ModuleType):
    @property
    def prefix_python_logs_with_actor(self) -> bool:
        return actor_logging.PREFIX_WITH_ACTOR

    @prefix_python_logs_with_actor.setter
    def prefix_python_logs_with_actor(self, value: bool) -> None:
        actor_logging.PREFIX_WITH_ACTOR = bool(value)

    def __reduce__(self) -> tuple:
        # Pickled by name, as any module is (cloudpickle, sending a function that uses
        # monarch.actor.config, knows plain modules only by their exact type).
        return importlib.import_module, (self.__name__,)


sys.modules[__name__].__class__ = _Config
