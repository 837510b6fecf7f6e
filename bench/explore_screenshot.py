"""A picture of Model Explorer showing our node data: the model's graph in Model Explorer's UI,
coloured by one overlay of `Interpreter.node_data()`, taken by headless Chromium (Debian's
`chromium` package; `pip install ".[explore]" websocket-client`). The README's picture:

    python bench/explore_screenshot.py ../shared/models/face_detection_short_range.tflite \\
        docs/explore_face_cpu.png --backend cpu --overlay where

It starts Model Explorer's server on a free 127.0.0.1 port with the model and that overlay alone
(so the UI applies it), opens the address the server prints in Chromium, waits through
Chromium's DevTools protocol until the graph is drawn, saves the page, and stops both.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

SERVER = """
import json, sys
from tflite_taichi.tools import explore
with open(sys.argv[2]) as f:
    data = json.load(f)
explore.serve(sys.argv[1], data, port=int(sys.argv[3]), open_browser=False)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_address(server: subprocess.Popen, timeout: float) -> str:
    """The address with the model and node data that Model Explorer's server prints."""
    deadline = time.monotonic() + timeout
    for line in server.stdout:
        match = re.match(r"(http://127\.0\.0\.1:\d+/\?data=\S+)", line.strip())
        if match:
            return match.group(1)
        if time.monotonic() > deadline:
            break
    raise SystemExit(f"Model Explorer's server printed no address in {timeout:.0f} s")


class DevTools:
    """Chromium's DevTools protocol over its websocket (the `websocket-client` package)."""

    def __init__(self, ws_url: str):
        import websocket
        self.ws = websocket.create_connection(ws_url, timeout=60)
        self.next_id = 0

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise SystemExit(f"chromium: {method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression,
                         returnByValue=True).get("result", {}).get("value")


# Model Explorer has drawn the graph: the app's renderer canvas is there and the model's
# conversion is no longer under way
DRAWN = ("!!document.querySelector('canvas') && "
         "!document.body.innerText.includes('Converting')")


def show_ops(tools: DevTools, zoom: tuple) -> None:
    """Every op on its own (the toolbar's "flatten layers": Model Explorer first draws the
    model's name scopes as collapsed layers), the graph fitted to the window, then `zoom` =
    (wheel steps, x, y): that many Ctrl+wheel steps in at (x, y), the top of the graph."""
    for button in ("flatten-layers", "zoom-fit"):
        tools.evaluate(f"document.querySelector('.mat-icon-container.{button}').click()")
        time.sleep(3)
    steps, x, y = zoom
    for _ in range(steps):
        tools.call("Input.dispatchMouseEvent", type="mouseWheel", x=x, y=y, deltaX=0,
                   deltaY=-120, modifiers=2)
        time.sleep(0.3)
    tools.evaluate("document.activeElement && document.activeElement.blur()")   # no tooltip
    tools.call("Input.dispatchMouseEvent", type="mouseMoved", x=x + 400, y=y + 600)


def screenshot(url: str, out: str, size: str, wait_ms: int, timeout: float,
               zoom: tuple = (3, 615, 110)) -> None:
    """Open `url` in headless Chromium, wait until the graph is drawn, show its ops (show_ops),
    wait `wait_ms` more for the overlay's colours, and save the page as a PNG."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium here: apt-get install chromium")
    width, height = (int(v) for v in size.split(","))
    port = free_port()
    with tempfile.TemporaryDirectory() as profile:
        browser = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--hide-scrollbars",
             "--use-angle=swiftshader", "--enable-unsafe-swiftshader",     # WebGL without a GPU
             f"--user-data-dir={profile}", f"--window-size={width},{height}",
             f"--remote-debugging-port={port}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            tools = DevTools(_page_socket(port, timeout=60))
            tools.call("Page.enable")
            tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                       deviceScaleFactor=1, mobile=False)
            tools.call("Page.navigate", url=url)
            deadline = time.monotonic() + timeout
            while not tools.evaluate(DRAWN):
                if time.monotonic() > deadline:
                    raise SystemExit(f"Model Explorer drew no graph in {timeout:.0f} s")
                time.sleep(1)
            show_ops(tools, zoom)
            time.sleep(wait_ms / 1000)
            png = tools.call("Page.captureScreenshot", format="png")["data"]
            with open(out, "wb") as f:
                f.write(base64.b64decode(png))
        finally:
            browser.kill()
            browser.wait(timeout=30)


def _page_socket(port: int, timeout: float) -> str:
    """The websocket of Chromium's first page, once its DevTools endpoint answers."""
    import urllib.request
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=5) as r:
                pages = [t for t in json.load(r) if t.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"chromium's DevTools did not answer in {timeout:.0f} s")
        time.sleep(0.5)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("out", help="the PNG to write")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--overlay", default="where", choices=["where", "why", "fusion", "time"])
    parser.add_argument("--size", default="1600,1000", help="the window, W,H (default 1600,1000)")
    parser.add_argument("--zoom", default="3,615,110",
                        help="STEPS,X,Y: Ctrl+wheel steps in at window point X,Y once the graph "
                             "is fitted (default 3,615,110: the top of the graph, legible)")
    parser.add_argument("--wait-ms", type=int, default=3000,
                        help="time for the overlay's colours once the graph is drawn (default 3000)")
    args = parser.parse_args(argv)
    from tflite_taichi.tools import explore
    data = explore.collect(args.model, args.backend, profile=args.overlay == "time")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "node_data.json")
        with open(path, "w") as f:
            json.dump({args.overlay: data[args.overlay]}, f)
        server = subprocess.Popen([sys.executable, "-c", SERVER, args.model, path, str(free_port())],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            url = server_address(server, timeout=90)
            screenshot(url, args.out, args.size, args.wait_ms, timeout=180,
                       zoom=tuple(int(v) for v in args.zoom.split(",")))
        finally:
            server.kill()
            server.wait(timeout=30)
    print(f"{args.out}: {args.model} on {args.backend}, overlay {args.overlay}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
