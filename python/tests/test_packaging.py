"""The package builds into a wheel that installs in a fresh virtualenv and imports."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
# pip's retries back off for seconds per unreachable index; where the configured index is a local
# mirror and nothing else is reachable they only slow the test down (set PIP_RETRIES to override).
ENV = {**os.environ, "PIP_RETRIES": os.environ.get("PIP_RETRIES", "0"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.mark.timeout(240)
def test_the_wheel_installs_in_a_fresh_venv_and_imports(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    # --no-isolation: the build backend (hatchling) comes pinned from requirements-test.txt
    # instead of a fresh download into a throwaway environment on every run.
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(PROJECT)],
                   check=True, capture_output=True, text=True, env=ENV)
    wheels = list(dist.glob("toolport_plugin-*-py3-none-any.whl"))
    assert len(wheels) == 1, list(dist.iterdir())

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    # The test environment's pip installs into the fresh venv (pip --python), sparing ensurepip.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", str(wheels[0])],
                   check=True, capture_output=True, text=True, env=ENV)
    probe = (
        "import toolport_plugin as t; from typing import Literal\n"
        "p = t.Plugin('probe')\n"
        "@p.tool\n"
        "async def f(x: Literal['a', 'b']) -> str: return x\n"
        "import json; print(json.dumps([t.__version__, p.source, p.tools['f'].parameters['properties']['x']['enum'], t.__file__]))"
    )
    out = subprocess.run([str(python), "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    version, source, enum, location = json.loads(out)
    assert (version, source, enum) == ("0.1.0", "plugin:probe", ["a", "b"])
    assert str(env_dir) in location  # imported from the fresh venv, not from the source tree
    # py.typed travels in the wheel, so type checkers read the hints.
    assert (Path(location).parent / "py.typed").exists()
