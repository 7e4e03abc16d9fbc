"""monarch.job.shell when this side's stdin ends: the shell and its foreground command stop.

Fed "sleep 300" and then EOF, shell() returns the hung-up shell's status (129) long before the
sleep would end.  Runs unchanged on monarch and on torchmonarch 0.7.0 (test_api_compat.py).
"""

from monarch.actor import this_host
from monarch.job import shell

code = shell(this_host())
print("\nshell returned", code, flush=True)
