"""A real Toolport, started from its CLI (``node dist/main/bin/toolport.js serve``, the package's
``toolport`` command), for every test.

The repository's ``npm run build`` must have run (``scripts/test-python.sh`` does it).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
import pytest

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "dist" / "main" / "bin" / "toolport.js"
_LISTENING = re.compile(r"Toolport listening on (http://\S+)")


class Toolport:
    """One Toolport process; ``kill()`` and ``start()`` again on the same port simulate a crash."""

    def __init__(self, roles: list[str], extra_args: list[str] | None = None) -> None:
        self.roles = roles
        self.extra_args = extra_args or []
        self.port = 0
        self.url = ""
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    def start(self) -> None:
        node = shutil.which("node")
        assert node is not None, "node is not on PATH"
        args = [node, str(CLI), "serve", "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warn"]
        for role in self.roles:
            args += ["--role", role]
        args += self.extra_args
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLPORT_")}
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line == "":
                raise RuntimeError(f"Toolport exited before listening: {''.join(self.output)}")
            self.output.append(line)
            match = _LISTENING.search(line)
            if match:
                self.url = match.group(1)
                self.port = int(self.url.rsplit(":", 1)[1])
                break
        else:
            raise RuntimeError("Toolport did not say it was listening within 20 s")
        # Keep draining its output so a chatty Toolport never blocks on a full pipe.
        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.output.append(line)

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, every registration is lost (docs/protocol.md R3)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def new_toolport(roles: list[str], extra_args: list[str] | None = None) -> Toolport:
    """A Toolport not started yet (its port 0: any free port once started)."""
    if not CLI.exists():
        pytest.fail(f"{CLI} is missing: run `npm run build` in {REPO} first (scripts/test-python.sh does)")
    return Toolport(roles, extra_args)


def unstarted_toolport(roles: list[str], extra_args: list[str] | None = None) -> Toolport:
    """A Toolport not started yet, on a port nothing listens on (``start()`` serves there)."""
    tp = new_toolport(roles, extra_args)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        tp.port = probe.getsockname()[1]
    tp.url = f"http://127.0.0.1:{tp.port}"
    return tp


def start_toolport(roles: list[str], extra_args: list[str] | None = None) -> Toolport:
    tp = new_toolport(roles, extra_args)
    tp.start()
    return tp


@pytest.fixture(scope="session")
def toolport() -> Iterator[Toolport]:
    """A Toolport shared by the tests that neither kill nor restart it."""
    tp = start_toolport(["default", "Mochi"])
    yield tp
    tp.stop()


@pytest.fixture
def own_toolport() -> Iterator[Toolport]:
    """A Toolport of the test's own, for tests that kill it."""
    tp = start_toolport(["default"])
    yield tp
    tp.stop()


class Api:
    """The test's own client of Toolport's HTTP API (what a model host would call)."""

    def __init__(self, session: aiohttp.ClientSession, tp: Toolport) -> None:
        self.session = session
        self.tp = tp

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.session.get(self.tp.url + path) as res:
            return res.status, await res.json()

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        async with self.session.post(self.tp.url + path, data=json.dumps(body), headers={"content-type": "application/json"}) as res:
            return res.status, await res.json()

    async def call(self, name: str, arguments: Any, role: str = "default") -> dict[str, Any]:
        status, body = await self.post("/api/tools/call", {"role": role, "name": name, "arguments": arguments})
        assert status == 200, body
        return body

    async def tools(self, role: str | None = None) -> dict[str, list[dict[str, Any]]]:
        status, body = await self.get("/api/tools" + (f"?role={role}" if role else ""))
        assert status == 200, body
        return body["tools_by_role"]

    async def names(self, role: str = "default") -> list[str]:
        try:
            return [t["name"] for t in (await self.tools(role))[role]]
        except (aiohttp.ClientError, OSError):
            return []

    async def wait_for(self, predicate: Any, timeout: float = 10.0, what: str = "condition") -> float:
        """Polls ``predicate`` (async) until true; returns the seconds it took."""
        started = time.monotonic()
        while True:
            try:
                if await predicate():
                    return time.monotonic() - started
            except (aiohttp.ClientError, OSError):
                pass
            if time.monotonic() - started > timeout:
                raise AssertionError(f"{what} not reached within {timeout} s")
            await asyncio.sleep(0.05)


@pytest.fixture
async def api(toolport: Toolport) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(session, toolport)


@pytest.fixture
async def own_api(own_toolport: Toolport) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(session, own_toolport)


async def serve_on_loopback(app: web.Application) -> tuple[web.AppRunner, str]:
    """Serves ``app`` on 127.0.0.1 at a free port (a stand-in for Toolport); returns its runner,
    whose ``cleanup()`` stops it, and its URL."""
    runner = web.AppRunner(app, shutdown_timeout=0, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
