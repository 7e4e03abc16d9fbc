"""Compatibility only: Monarch's ``monarch._src.actor.debugger`` names (its debugger's command language,
session table and IO).  Monarch's debugger is an actor on the client; monarch's is ``monarch debug``,
which reaches ``breakpoint()`` in any actor through each host agent's debug service (README 'Debugging').
These modules give Monarch's programs the same command parser and session bookkeeping."""
