"""Headless Chromium driven over the Chrome DevTools Protocol (tiny client on websocket-client).

Loads a page, collects console errors, uncaught exceptions, log errors and every network
request, evaluates a script, and captures a full-page PNG screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def find_chromium() -> str | None:
    for path in CHROMIUM_CANDIDATES:
        if os.path.exists(path):
            return path
    return shutil.which("chromium")


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    value: Any = None
    screenshot: Path | None = None


class _CDP:
    def __init__(self, ws_url: str) -> None:
        import websocket  # websocket-client (dev dependency)

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"CDP {method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("method") == method:
                return msg
            self.events.append(msg)
        raise TimeoutError(f"no {method} within {timeout}s")

    def close(self) -> None:
        self.ws.close()


def load_page(html_path: Path, *, script: str, screenshot: Path, width: int = 1280, height: int = 4000,
              user_data_dir: Path) -> PageResult:
    """Open `html_path` in headless Chromium; return errors, requests, script value, screenshot."""
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError("chromium not found")
    user_data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", f"--user-data-dir={user_data_dir}", "--remote-debugging-port=0",
         "--remote-allow-origins=*", f"--window-size={width},{height}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    cdp = None
    try:
        port_file = user_data_dir / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit code {proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().splitlines()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            targets = json.loads(resp.read())
        page = next(t for t in targets if t.get("type") == "page")
        cdp = _CDP(page["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            cdp.call(f"{domain}.enable")
        cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        cdp.call("Page.navigate", url=html_path.resolve().as_uri())
        cdp.wait_event("Page.loadEventFired", timeout=60)
        result = PageResult()
        value = cdp.call("Runtime.evaluate", expression=script, returnByValue=True)
        if "exceptionDetails" in value:
            raise RuntimeError(f"test script failed: {value['exceptionDetails']}")
        result.value = value["result"].get("value")
        shot = cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        result.screenshot = screenshot
        for ev in cdp.events:
            method, params = ev.get("method"), ev.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                result.errors.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                desc = (details.get("exception") or {}).get("description", "")
                result.errors.append(f"exception: {details.get('text')} {desc}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                result.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")
            elif method == "Network.requestWillBeSent":
                result.requests.append(params.get("request", {}).get("url", ""))
            elif method == "Network.loadingFailed":
                result.errors.append(f"network: {params.get('errorText')}")
        return result
    finally:
        if cdp is not None:
            cdp.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
