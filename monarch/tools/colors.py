"""Terminal colours for ``monarch.tools``' messages, as PyTorch Monarch names them: empty strings
unless stdout is a terminal, so piped output stays plain."""

import sys

_TTY = not sys.stdout.closed and sys.stdout.isatty()

GREEN: str = "\033[32m" if _TTY else ""
BLUE: str = "\033[34m" if _TTY else ""
ORANGE: str = "\033[38:2:238:76:44m" if _TTY else ""
GRAY: str = "\033[2m" if _TTY else ""
CYAN: str = "\033[36m" if _TTY else ""
ENDC: str = "\033[0m" if _TTY else ""
