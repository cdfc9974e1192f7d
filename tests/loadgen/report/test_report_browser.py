"""report.html in headless Chromium: no console errors, no network requests (it opens offline), no
injected markup, and every plot rendered (each plot div drawn by plotly.js with its SVG).

Chromium is driven over the DevTools protocol with aiohttp's websocket client. Install it with
``scripts/install-chromium.sh`` (Debian's ``chromium``); without it these tests skip and say so.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest

from loadgen.report import write_compare, write_report
from tests.run_folders import make_capacity_run, make_empty_run, make_fixed_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (scripts/install-chromium.sh)")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--mute-audio", "--remote-debugging-port=0", "--remote-allow-origins=*"]

PROBE = """(() => {
  const plots = Array.from(document.querySelectorAll("div.plot"));
  return JSON.stringify({
    expected: Number(document.body.getAttribute("data-plots-expected")),
    plots: plots.length,
    rendered: plots.filter(d => d.getAttribute("data-rendered") === "1" && d.querySelector("svg.main-svg")
                               && d.querySelectorAll("g.trace, g.barlayer .point, g.scatterlayer .trace").length > 0
                               && d.getBoundingClientRect().height > 100).length,
    injected: document.querySelectorAll("img[src=x], img[onerror]").length,
    xss: window.__xss || 0,
    title: document.title,
  });
})()"""


class Browser:
    """One headless Chromium with its DevTools websocket, for one page load."""

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="slobench-chromium-", ignore_cleanup_errors=True)
        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self.tmp.name}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.ids = itertools.count(1)
        self._port: int | None = None

    def port(self, timeout: float = 30.0) -> int:
        f = Path(self.tmp.name) / "DevToolsActivePort"
        end = time.monotonic() + timeout
        while self._port is None and time.monotonic() < end:
            if f.is_file() and f.read_text().strip():
                self._port = int(f.read_text().split()[0])
                return self._port
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            time.sleep(0.05)
        if self._port is None:
            raise TimeoutError("chromium did not open its DevTools port")
        return self._port

    def close(self) -> None:
        """End the browser and its helper processes (its own process group, started above)."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        time.sleep(0.1)
        self.tmp.cleanup()


@pytest.fixture(scope="module")
def browser():
    br = Browser()
    try:
        yield br
    finally:
        br.close()


async def _open(br: Browser, page: Path, timeout: float = 60.0, screenshot: Path | None = None) -> dict:
    """Load ``page`` in a new tab; returns the probe's result plus the console errors, exceptions,
    dialogs and non-file requests seen; with ``screenshot``, a full-page PNG of it written there."""
    port = await asyncio.get_running_loop().run_in_executor(None, br.port)
    async with aiohttp.ClientSession() as s:
        async with s.put(f"http://127.0.0.1:{port}/json/new?about:blank") as r:
            tab = await r.json(content_type=None)
        try:
            async with s.ws_connect(tab["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                pending: dict[int, asyncio.Future] = {}
                seen = {"errors": [], "requests": [], "dialogs": []}
                loaded = asyncio.Event()

                async def reader():
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            continue
                        m = json.loads(msg.data)
                        if "id" in m and m["id"] in pending:
                            pending.pop(m["id"]).set_result(m)
                            continue
                        method, p = m.get("method"), m.get("params", {})
                        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                            seen["errors"].append("console: " + " ".join(
                                str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
                        elif method == "Runtime.exceptionThrown":
                            d = p.get("exceptionDetails", {})
                            seen["errors"].append("exception: " + str(d.get("exception", {}).get("description")
                                                                       or d.get("text")))
                        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                            seen["errors"].append("log: " + p["entry"].get("text", ""))
                        elif method == "Network.requestWillBeSent":
                            url = p.get("request", {}).get("url", "")
                            if not url.startswith(("file:", "data:", "blob:", "about:")):
                                seen["requests"].append(url)
                        elif method == "Page.javascriptDialogOpening":
                            seen["dialogs"].append(p.get("message"))
                            asyncio.ensure_future(call("Page.handleJavaScriptDialog", accept=True))
                        elif method == "Page.loadEventFired":
                            loaded.set()

                async def call(method, **params):
                    i = next(br.ids)
                    fut = asyncio.get_running_loop().create_future()
                    pending[i] = fut
                    await ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
                    return await asyncio.wait_for(fut, 30)

                task = asyncio.ensure_future(reader())
                for dom in ("Runtime", "Log", "Network", "Page"):
                    await call(f"{dom}.enable")
                await call("Emulation.setDeviceMetricsOverride", width=1400, height=1000, deviceScaleFactor=1,
                           mobile=False)
                await call("Page.navigate", url=page.resolve().as_uri())
                await asyncio.wait_for(loaded.wait(), timeout)
                end = time.monotonic() + timeout
                while True:
                    res = await call("Runtime.evaluate", expression=PROBE, returnByValue=True)
                    probe = json.loads(res["result"]["result"]["value"])
                    if probe["rendered"] >= probe["expected"] or time.monotonic() > end:
                        break
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.3)  # late errors (a resize handler, a second frame)
                if screenshot is not None:
                    # the viewport made as tall as the page first: resizing while capturing re-lays the plots
                    # out (plotly's responsive handler) and a plot can overflow its section in the picture
                    size = (await call("Page.getLayoutMetrics"))["result"]["cssContentSize"]
                    await call("Emulation.setDeviceMetricsOverride", width=1400, height=int(size["height"]),
                               deviceScaleFactor=1, mobile=False)
                    await asyncio.sleep(1.5)
                    size = (await call("Page.getLayoutMetrics"))["result"]["cssContentSize"]
                    shot = await call("Page.captureScreenshot", format="png",
                                      clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"],
                                            "scale": 1})
                    screenshot.write_bytes(base64.b64decode(shot["result"]["data"]))
                task.cancel()
                return {**probe, **seen}
        finally:
            async with s.get(f"http://127.0.0.1:{port}/json/close/{tab['id']}") as r:
                await r.read()


def open_page(br: Browser, page: Path, screenshot: Path | None = None) -> dict:
    return asyncio.run(_open(br, page, screenshot=screenshot))


def _check(res: dict, plots: int) -> None:
    assert res["errors"] == [], res["errors"]
    assert res["requests"] == [], f"the page fetched from the network: {res['requests']}"
    assert res["dialogs"] == [] and res["injected"] == 0 and res["xss"] == 0, "markup from the run was injected"
    assert res["expected"] == plots, res
    assert res["plots"] == res["expected"], res
    assert res["rendered"] == res["expected"], f"plots not rendered: {res}"


def test_capacity_report_renders_in_chromium(browser, tmp_path):
    """Every figure drawn; a full-page screenshot taken (kept in $SLOBENCH_REPORT_SHOTS when set, to look at)."""
    run = make_capacity_run(tmp_path / "cap")  # error strings carry </script><img onerror>
    shots = Path(os.environ.get("SLOBENCH_REPORT_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    res = open_page(browser, write_report(run), screenshot=shots / "capacity-report.png")
    # throughput and latencies against offered load, the rating's evidence, 4 distributions, breakdown, health
    _check(res, plots=9)
    assert "cap" in res["title"]
    png = (shots / "capacity-report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 1300 and height > 5000  # the whole page, not the 1000-pixel viewport


def test_edge_reports_render_in_chromium(browser, tmp_path):
    for name, build, plots in (
        ("fixed", make_fixed_run, 4),
        ("failed", lambda p: make_fixed_run(p, fail_all=True), 1),  # health only (rejections, metrics)
        ("nometrics", lambda p: make_fixed_run(p, metrics=False, summary=False, timing=False), 3),
        ("empty", make_empty_run, 0),
    ):
        res = open_page(browser, write_report(build(tmp_path / name)))
        _check(res, plots)


def test_compare_page_renders_in_chromium(browser, tmp_path):
    a = make_capacity_run(tmp_path / "a")
    b = make_capacity_run(tmp_path / "b", scale=0.8, seed=1)
    res = open_page(browser, write_compare(a, b))
    _check(res, plots=4)


def test_the_browser_check_catches_errors(browser, tmp_path):
    """The harness itself: a console error, an exception and a broken figure are all reported."""
    page = write_report(make_fixed_run(tmp_path / "run"))
    html = page.read_text()
    i = html.index('<script type="application/json" class="plot-data"')
    j = html.index(">", i) + 1
    html = html[:j] + "{not json" + html[j:]
    html = html.replace("</body>", "<script>console.error('boom'); null.x;</script></body>")
    page.write_text(html)
    res = asyncio.run(_open(browser, page, timeout=3.0))
    assert any("boom" in e for e in res["errors"]), res["errors"]
    assert any("exception" in e for e in res["errors"]), res["errors"]
    assert res["rendered"] < res["expected"]
