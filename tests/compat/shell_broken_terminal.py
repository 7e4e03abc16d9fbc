"""monarch.job.shell when what it shows cannot be written: shell() raises (and the shell ends).

Runs unchanged on monarch and on torchmonarch 0.7.0 (test_api_compat.py compares them).
"""

import os

from monarch.actor import this_host
from monarch.job import shell

read_end, write_end = os.pipe()
os.close(read_end)  # nobody reads the shell's terminal
saved = os.dup(1)
os.dup2(write_end, 1)
try:
    shell(this_host())
    outcome = "returned"
except ConnectionError as e:  # a broken pipe (Monarch's asyncio reports a reset)
    outcome = f"raised a ConnectionError: {isinstance(e, OSError)}"
finally:
    os.dup2(saved, 1)
print("broken terminal:", outcome, flush=True)
