"""monarch: reserve hosts once, run many times.

``monarch.actor`` is the actor API; ``monarch.job`` loads a reservation made by
``monarch serve``.
"""

__version__ = "0.1.0"
