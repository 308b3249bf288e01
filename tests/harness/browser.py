"""A real headless Chromium for the tests, driven over the DevTools protocol on a pipe.

``open_page`` loads a file in a fresh browser profile and returns what the page became: the
answer of a script run against its DOM, a PNG screenshot, and every network request the page
made (the DevTools ``Network.requestWillBeSent`` log, the document itself included). Chromium
is Debian's ``chromium`` package (``scripts/bootstrap-tools`` installs it for ``make test``);
``NPA_CHROMIUM_BIN`` names another binary.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import struct
import subprocess
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Bounds a browser that hangs; a page of this project loads in well under a second idle.
DEADLINE = 120.0


def chromium_binary() -> str:
    """The Chromium the report tests drive: ``$NPA_CHROMIUM_BIN``, else ``chromium`` on PATH.
    The test set-up installs it (scripts/bootstrap-tools, test profile), so a missing one fails
    the test: a skipped browser test would prove nothing."""
    import pytest

    named = os.environ.get("NPA_CHROMIUM_BIN")
    found = (named if os.access(named, os.X_OK) else None) if named else shutil.which("chromium")
    if found is None:
        pytest.fail(
            "no Chromium: scripts/bootstrap-tools --only chromium installs Debian's chromium "
            "(or set NPA_CHROMIUM_BIN)"
        )
    return found


@dataclass
class Loaded:
    value: Any  # what the DOM script returned (parsed from JSON)
    screenshot: bytes  # PNG
    requests: list[str] = field(default_factory=list)  # URLs the page asked for


class DevTools:
    """One Chromium process and its DevTools pipe (Chromium reads fd 3, writes fd 4)."""

    def __init__(self, binary: str, profile: Path, log: Path) -> None:
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        argv = [
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--remote-debugging-pipe", f"--user-data-dir={profile}", "--hide-scrollbars",
            "--window-size=1280,1600", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-default-browser-check",
        ]  # fmt: skip
        redirect = f'exec "$@" 3<&{to_browser_r} 4>&{from_browser_w}'
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            ["bash", "-c", redirect, "bash", *argv],
            pass_fds=(to_browser_r, from_browser_w),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None
             ) -> dict[str, Any]:  # fmt: skip
        """Call ``method`` and wait for its answer (events seen meanwhile are kept)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        answer = self._read_until(lambda m: m.get("id") == self._next_id, f"the answer to {method}")
        if "error" in answer:
            raise AssertionError(f"DevTools {method} failed: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    def wait_event(self, method: str, session: str | None = None) -> dict[str, Any]:
        for i, event in enumerate(self.events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self.events.pop(i)
        found = self._read_until(
            lambda m: m.get("method") == method and m.get("sessionId") == session, method
        )
        self.events.remove(found)
        return found

    def _read_until(self, wanted: Any, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + DEADLINE
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "method" in message:
                    self.events.append(message)
                if wanted(message):
                    return dict(message)
            left = deadline - time.monotonic()
            assert left > 0, f"Chromium did not send {what} within {DEADLINE:.0f} s"
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                assert chunk, f"Chromium closed its DevTools pipe before {what}"
                self._buffer += chunk

    def close(self) -> None:
        with contextlib.suppress(AssertionError, OSError):
            self.send("Browser.close")
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._log.close()


def open_page(binary: str, page: Path, script: str, workdir: Path) -> Loaded:
    """Load ``page`` in a fresh headless Chromium; run ``script`` (an expression that returns a
    JSON string) against its DOM, take a screenshot, and return them with the request log."""
    workdir.mkdir(parents=True, exist_ok=True)
    tools = DevTools(binary, workdir / "profile", workdir / "chromium.log")
    try:
        target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        tools.send("Network.enable", session=session)
        tools.send("Page.enable", session=session)
        tools.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        tools.wait_event("Page.loadEventFired", session)
        got = tools.send(
            "Runtime.evaluate", {"expression": script, "returnByValue": True}, session=session
        )
        assert "exceptionDetails" not in got, got
        shot = tools.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": False},
            session=session,
        )  # fmt: skip
        requests = [
            e["params"]["request"]["url"]
            for e in tools.events
            if e.get("method") == "Network.requestWillBeSent" and e.get("sessionId") == session
        ]
        return Loaded(json.loads(got["result"]["value"]), base64.b64decode(shot["data"]), requests)
    finally:
        tools.close()


# --- a PNG's pixels (8-bit RGB or RGBA, as Chromium writes them) -------------------------------


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of a non-interlaced 8-bit PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    step = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * step
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if kind == 2:  # the common cases, without a loop over each byte
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous, strict=True))
        for x in range(stride if kind in (1, 3, 4) else 0):
            left = line[x - step] if x >= step else 0
            up = previous[x]
            corner = previous[x - step] if x >= step else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                best = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[x] = (line[x] + best) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, rows


def luminance_spread(data: bytes, sample: int = 4) -> tuple[float, int]:
    """(variance of the grey level, number of distinct colours) over every ``sample``-th pixel
    of every ``sample``-th row: a blank page has variance 0 and one colour."""
    width, _, rows = png_pixels(data)
    step = len(rows[0]) // width
    greys: list[float] = []
    colours: set[bytes] = set()
    for row in rows[::sample]:
        for x in range(0, width, sample):
            px = row[x * step : x * step + 3]
            colours.add(px)
            greys.append(0.299 * px[0] + 0.587 * px[1] + 0.114 * px[2])
    mean = sum(greys) / len(greys)
    return sum((g - mean) ** 2 for g in greys) / len(greys), len(colours)


# What the tests read of the rendered page, through the browser's own DOM.
REPORT_DOM = """JSON.stringify({
  title: document.title,
  state: document.querySelector('#run-state').textContent.trim(),
  stages: [...document.querySelectorAll('#stages tr[data-stage]')].map(r =>
    [r.dataset.stage, r.dataset.state, r.querySelector('.failure-class').textContent.trim()]),
  nodes: [...document.querySelectorAll('svg.dag g.node')].map(g =>
    [g.dataset.stage, g.textContent]),
  commands: [...document.querySelectorAll('pre.command code')].map(c => c.textContent),
  missing: [...document.querySelectorAll('#missing-outputs li')].map(l => l.textContent),
  outputs: [...document.querySelectorAll('tr[data-output]')].map(r =>
    [r.closest('section').dataset.stage, r.dataset.output, r.dataset.status]),
  log: [...document.querySelectorAll('pre.log')].map(p => p.textContent).join(''),
  sources: [...document.querySelectorAll('#sources tr[data-source]')].map(r =>
    [r.dataset.source, r.dataset.standing]),
  bars: document.querySelectorAll('svg.timeline rect.bar').length,
  phases: document.querySelectorAll('svg.timeline rect.phase').length,
  outcomes: [...document.querySelectorAll('svg.timeline rect.attempt')].map(r =>
    r.dataset.outcome),
  shardLabels: [...document.querySelectorAll('svg.timeline text.shard')].map(t => t.textContent),
  attempts: [...document.querySelectorAll('#attempts tr[data-attempt]')].map(r =>
    [r.dataset.stage, r.dataset.shard, r.dataset.attempt, r.dataset.outcome, r.dataset.phases]),
  phaseNotes: [...document.querySelectorAll('.phases-note')].map(p => p.dataset.stage),
  markers: [...document.querySelectorAll('#markers td')].map(t => t.textContent).join(' '),
  dagHeight: document.querySelector('svg.dag').getBoundingClientRect().height,
  scripts: document.scripts.length,
  images: document.images.length,
  refresh: [...document.querySelectorAll('meta[http-equiv=refresh]')].length,
  banner: (document.querySelector('#not-live') || {textContent: ''}).textContent,
})"""


def look_at_report(chromium: str, page: Path, tmp_path: Path, name: str) -> dict[str, Any]:
    """Open the page; keep its screenshot beside it and check nothing was fetched."""
    loaded = open_page(chromium, page, REPORT_DOM, tmp_path / f"chromium-{name}")
    shot = tmp_path / f"{name}.png"
    shot.write_bytes(loaded.screenshot)
    variance, colours = luminance_spread(loaded.screenshot)
    assert variance > 100 and colours > 10, (shot, variance, colours)
    # The DevTools request log: the document itself, and nothing else.
    assert loaded.requests == [page.resolve().as_uri()], loaded.requests
    dom: dict[str, Any] = loaded.value
    assert dom["scripts"] == 0 and dom["images"] == 0
    return dom
