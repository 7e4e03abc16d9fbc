"""PyTorch Monarch's argparse CLI (``python -m monarch.tools.cli``): its parser, its contexts as
folders of ``.monarch/``, and apply / exec / kill of a job object from a module of the working
directory.  Runs unchanged on monarch and on torchmonarch 0.7.0 and prints the same."""

import os
import re
import subprocess
import sys
import tempfile

from monarch.tools.cli import get_parser

parser = get_parser()
a = parser.parse_args(["exec", "--point", "hosts=1", "-e", "A=1", "-e", "B=2", "--", "echo", "hi"])
print("exec", a.point, a.env, a.cmd, a.run_all, a.mesh, a.one, a.per_host, a.kill, a.script, a.module)
a = parser.parse_args(["exec", "-m", "pkg.mod", "x"])
print("exec -m", a.module, a.cmd)
a = parser.parse_args(["shell", "--mesh", "trainers"])
print("shell", a.mesh, a.point, a.env, a.workdir, a.kill)
a = parser.parse_args(["apply"])
print("apply", a.module_path)
a = parser.parse_args(["kill", "other"])
print("kill", a.name)
a = parser.parse_args(["query", "SELECT 1", "--format", "jsonl", "--timeout", "1500ms"])
print("query", a.sql, a.output_format, a.timeout, a.sql_file)
a = parser.parse_args(["profile", "--time", "2m"])
print("profile", a.source, a.mast_job, a.duration, a.output)
a = parser.parse_args(["debug", "--port", "123"])
print("debug", a.port)
a = parser.parse_args(["context", "rm", "x"])
print("context", a.context_cmd, a.name)
for bad in (["exec", "--one", "--point", "hosts=0", "true"], ["profile", "--time", "0s"], ["tui"],
            ["query", "--format", "csv"]):
    try:
        with open(os.devnull, "w") as devnull:
            stderr, sys.stderr = sys.stderr, devnull
            try:
                parser.parse_args(bad)
            finally:
                sys.stderr = stderr
        print("accepted", bad)
    except SystemExit as e:
        print("refused", bad[0], e.code)


def cli(*args, cwd):
    r = subprocess.run([sys.executable, "-m", "monarch.tools.cli", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=300)
    out = re.sub(r"\(\d+s\)", "(Ns)", r.stdout)
    return r.returncode, out


with tempfile.TemporaryDirectory() as d:
    os.mkdir(os.path.join(d, ".monarch"))
    print(cli("context", "ls", cwd=d))
    print(cli("context", "create", "scratch", cwd=d))
    print("scratch is a folder", os.path.isdir(os.path.join(d, ".monarch", "scratch")))
    with open(os.path.join(d, ".monarch", "job_state.pkl"), "wb") as f:
        f.write(b"placeholder")
    print(cli("context", "use", "work", cwd=d))
    link = os.path.join(d, ".monarch", "job_state.pkl")
    print("link", os.path.islink(link), os.readlink(link),
          open(os.path.join(d, ".monarch", "default", "state.pkl"), "rb").read())
    print(cli("context", "ls", cwd=d))
    print(cli("context", "rm", "work", cwd=d))
    print("link", os.readlink(link), os.path.exists(os.path.join(d, ".monarch", "work")))
    print(cli("context", "rm", "scratch", cwd=d))
    print(cli("context", "rm", "default", cwd=d))

    with open(os.path.join(d, "onejob.py"), "w") as f:
        f.write("from monarch.job import ProcessJob\njob = ProcessJob({'hosts': 2})\n")
    print(cli("apply", "onejob.job", cwd=d))
    print("spec", open(os.path.join(d, ".monarch", "default", "spec")).read())
    print(cli("exec", "--", "sh", "-c", "echo from $MONARCH_RANK_HOSTS of $MONARCH_SIZE_HOSTS", cwd=d))
    print(cli("exec", "--point", "hosts=1", "--", "sh", "-c", "exit 3", cwd=d))
    print(cli("kill", cwd=d))
    print("state left", os.path.exists(os.path.join(d, ".monarch", "default", "state.pkl")))
print("done")
