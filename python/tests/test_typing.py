"""The package's type hints (it ships ``py.typed``), as ``mypy --strict`` reads them in a plugin's
code: the README's own forms type-check, and the decorators keep the tool's signature, so a wrong
call of a tool, or a listener of the wrong event, is a type error."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
SRC = PROJECT / "src"

GOOD = '''
from toolport_plugin import CallContext, Plugin, PluginError, RegisteredEvent

plugin = Plugin("typed", toolport_url="http://127.0.0.1:3917")


@plugin.tool
async def add(a: int, b: int) -> int:
    return a + b


@plugin.tool(description="Echo text.", timeout_seconds=5)
def echo(text: str, ctx: CallContext) -> str:
    return text


def on_registered(event: RegisteredEvent) -> None:
    print(event.names)


async def on_error(err: PluginError) -> None:
    print(err.code)


plugin.on("registered", on_registered)
plugin.on("error", on_error)


async def three() -> int:
    return await add(1, 2)  # the decorated tool is still the function it was
'''

BAD = '''
from toolport_plugin import Plugin, PluginError

plugin = Plugin("typed", toolport_url="http://127.0.0.1:3917")


@plugin.tool(description="Twice.")
def twice(n: int) -> int:
    return 2 * n


def on_error(err: PluginError) -> None:
    print(err.code)


twice("not an int")
name: str = twice(1)
plugin.on("registered", on_error)
'''


def mypy(tmp_path: Path, name: str, code: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(code))
    return run_mypy(tmp_path, str(path))


def run_mypy(tmp_path: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    # The package's own mypy settings (strict; jsonschema has no hints), its source on the path.
    env = {**os.environ, "MYPYPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(PROJECT / "pyproject.toml"), "--strict", "--no-error-summary",
         "--cache-dir", str(tmp_path / ".mypy"), *targets],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )


@pytest.mark.timeout(180)
def test_the_package_type_checks_under_strict(tmp_path: Path) -> None:
    checked = run_mypy(tmp_path, str(SRC / "toolport_plugin"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.timeout(180)
def test_the_readme_forms_type_check_under_strict_and_misuse_is_a_type_error(tmp_path: Path) -> None:
    good = mypy(tmp_path, "good", GOOD)
    assert good.returncode == 0, good.stdout + good.stderr

    bad = mypy(tmp_path, "bad", BAD)
    lines = [line for line in bad.stdout.splitlines() if ": error:" in line]
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert any(":16:" in line and "arg-type" in line for line in lines), lines  # twice("not an int")
    assert any(":17:" in line and "assignment" in line for line in lines), lines  # name: str = twice(1)
    assert any(":18:" in line and ("call-overload" in line or "arg-type" in line) for line in lines), lines
    assert len(lines) == 3, lines
