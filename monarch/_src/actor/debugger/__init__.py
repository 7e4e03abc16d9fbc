"""Compatibility only: Monarch's ``monarch._src.actor.debugger``: its debugger actor (``DebugController``),
the pdb session an actor's ``breakpoint()`` opens in it, its command language, session table and IO.
monarch's own debugger is ``monarch debug``, which reaches ``breakpoint()`` in any actor or rank
through each host agent's debug service (README 'Debugging'); Monarch's is used where a program makes
that actor itself (``debug_controller()``)."""
