"""`monarch dashboard --web` in a real headless Chromium (Debian's `chromium`), on a real reservation.

The browser loads the page textual-serve serves, its xterm.js connects the websocket and
draws the app (to a canvas, so there is no text in the DOM).  The test drives Chromium
through the DevTools protocol (its websocket, spoken with aiohttp, which textual-serve
already depends on): before the page loads it hooks the page's terminal object, then reads
what the terminal shows from xterm's own buffer, types a key with Input.dispatchKeyEvent
(the path a person's keyboard takes), and reads the screen again.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import psutil
import pytest

from tests.cli.conftest import MONARCH, ROOT, monarch
from tests.tui.test_dashboard import web_url

CHROMIUM = shutil.which("chromium")
#: Without the background-networking flags Chromium dials out at start (updates, sync, QUIC
#: probes); on a closed network that stalls it, and it is no part of the test.  --no-sandbox: CI
#: runs as root; --disable-dev-shm-usage: a container's /dev/shm can be too small for it.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1280,800", "--remote-debugging-port=0"]

#: Runs in the page before its own scripts: keeps the terminal that textual-serve's client makes
#: (it sets ``this.terminal``, then ``this.fitAddon``, in its constructor) as window.__monarchTerminal.
HOOK = """
Object.defineProperty(Object.prototype, "fitAddon", {configurable: true, set(v) {
  Object.defineProperty(this, "fitAddon", {value: v, writable: true, configurable: true, enumerable: true});
  if (this.terminal) window.__monarchTerminal = this.terminal;
}});
"""
#: The lines the terminal shows now, from xterm's buffer (what is drawn, whatever the renderer).
SCREEN = """
(() => {
  const t = window.__monarchTerminal;
  if (!t) return null;
  const b = t.buffer.active, out = [];
  for (let y = 0; y < t.rows; y++) {
    const line = b.getLine(b.viewportY + y);
    out.push(line ? line.translateToString(true) : "");
  }
  return out.join("\\n");
})()
"""

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/install.sh --test)")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("web-job")
    monarch("serve", "--hosts", "2", cwd=d, check=True)
    r = monarch("run", "--", "python3", "-c", "import sys; print('hello from the web test'); sys.exit(3)", cwd=d,
                timeout=60)
    assert r.returncode == 3, r.stderr
    yield d
    monarch("stop", "--force", cwd=d, timeout=60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cdp:
    """Calls over one DevTools websocket; events in between are skipped."""

    def __init__(self, ws):
        self.ws = ws
        self.last_id = 0

    async def call(self, method: str, **params) -> dict:
        self.last_id += 1
        ident = self.last_id
        await self.ws.send_json({"id": ident, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=30)
            if msg.get("id") == ident:
                assert "error" not in msg, f"{method}: {msg['error']}"
                return msg.get("result", {})

    async def screen(self) -> str:
        r = await self.call("Runtime.evaluate", expression=SCREEN, returnByValue=True)
        return r["result"].get("value") or ""

    async def wait_screen(self, pred, what: str, timeout: float = 40.0) -> str:
        text = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = await self.screen()
            if pred(text):
                return text
            await asyncio.sleep(0.2)
        raise AssertionError(f"the page never showed {what}; it shows:\n{text}")

    async def press(self, key: str) -> None:
        await self.call("Input.dispatchKeyEvent", type="keyDown", key=key, text=key, unmodifiedText=key)
        await self.call("Input.dispatchKeyEvent", type="keyUp", key=key)


def devtools_port(profile: str, proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """The port Chromium chose for --remote-debugging-port=0 (it writes it in the profile)."""
    path = os.path.join(profile, "DevToolsActivePort")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"chromium exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            with open(path) as f:
                first = f.readline().strip()
            if first:
                return int(first)
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    raise AssertionError("chromium wrote no DevToolsActivePort")


def stop_tree(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> list[psutil.Process]:
    """Signal a process started in its own session and everything it started; the ones to wait for."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    return procs


def reap(proc: subprocess.Popen) -> None:
    procs = stop_tree(proc)
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=10)
    proc.wait(10)
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "processes left"


@pytest.mark.asyncio
async def test_web_dashboard_in_headless_chromium(job):
    import aiohttp

    port = free_port()
    server = subprocess.Popen([*MONARCH, "dashboard", "--web", "--port", str(port)], cwd=job,
                              env={**os.environ, "PYTHONPATH": ROOT}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    profile = tempfile.mkdtemp(prefix="monarch-chromium-")
    browser = None
    try:
        url = web_url(server)
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 30
            while True:
                try:
                    async with http.get(url) as r:
                        assert r.status == 200
                        break
                except aiohttp.ClientConnectionError:
                    assert server.poll() is None, server.stderr.read()
                    assert time.monotonic() < deadline, "the dashboard never served its page"
                    await asyncio.sleep(0.2)

            browser = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                       start_new_session=True)
            cdp_port = devtools_port(profile, browser)
            async with http.get(f"http://127.0.0.1:{cdp_port}/json/list") as r:
                pages = [t for t in await r.json() if t["type"] == "page"]
            async with http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                cdp = Cdp(ws)
                await cdp.call("Page.enable")
                await cdp.call("Page.addScriptToEvaluateOnNewDocument", source=HOOK)
                await cdp.call("Page.navigate", url=url)

                # The app started behind the page's websocket and drew the reservation.
                text = await cdp.wait_screen(lambda s: "host0" in s and "host1" in s and "hosts 2/2" in s,
                                             "the mesh tree and the header")
                header = text.splitlines()[0]
                assert "monarch" in header and "default" in header and "local job local-" in header, text
                assert "1 Mesh" in text and "2 Runs" in text  # the footer's key bindings

                # A key typed into the page reaches the app: 2 shows the runs, with the failed run.
                await cdp.call("Runtime.evaluate", expression="window.__monarchTerminal.focus()")
                await cdp.press("2")
                text = await cdp.wait_screen(lambda s: "ranks of the selected run" in s, "the runs view")
                assert "failed" in text and "python3 -c" in text, text
                assert "procs ·" not in text  # the tree's host rows are gone
                await cdp.call("Browser.close")
    finally:
        if browser is not None:
            reap(browser)
        reap(server)
        shutil.rmtree(profile, ignore_errors=True)
