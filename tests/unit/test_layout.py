"""The package layout: one namespace package over three source roots, stdlib `operator` intact."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cwd", [ROOT, ROOT / "operator", ROOT / "tests", Path("/")])
def test_stdlib_operator_is_not_shadowed(cwd: Path) -> None:
    code = "import operator, agentpool.operator; assert operator.add(2, 3) == 5; print(operator.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=True)
    assert "agentpool" not in out.stdout


def test_agentpool_is_a_namespace_over_three_roots() -> None:
    import agentpool.engine
    import agentpool.kv
    import agentpool.operator

    for module, root in (
        (agentpool.kv, "controlplane"),
        (agentpool.operator, "operator"),
        (agentpool.engine, "engine-image"),
    ):
        assert module.__file__ is not None
        assert Path(module.__file__).resolve().is_relative_to(ROOT / root)
    for root in ("controlplane", "operator", "engine-image"):
        assert not (ROOT / root / "agentpool" / "__init__.py").exists()


def test_installed_console_script_runs() -> None:
    exe = shutil.which("agentpool")
    assert exe is not None, "the `agentpool` console script is not installed (pip install -e .)"
    out = subprocess.run([exe, "--help"], cwd="/", capture_output=True, text=True, check=True)
    assert "simulate" in out.stdout


def test_every_direct_child_of_agentpool_is_a_package() -> None:
    """setup.py installs packages only: a module file beside the packages (agentpool/x.py) imports
    from a source tree but is missing from the installed distribution."""
    loose = [
        str(path.relative_to(ROOT))
        for root in ("controlplane", "operator", "engine-image")
        for path in (ROOT / root / "agentpool").glob("*.py")
    ]
    assert loose == [], f"make these packages (x/__init__.py): {loose}"


def _importlinter() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        config: dict[str, Any] = tomllib.load(f)["tool"]["importlinter"]
    return config


def test_import_linter_sees_every_direct_child_of_agentpool() -> None:
    """import-linter's root packages are the children (the editable install has no directory for
    the namespace itself): a child missing from the list would escape every contract."""
    children = {
        f"agentpool.{path.name}"
        for root in ("controlplane", "operator", "engine-image")
        for path in (ROOT / root / "agentpool").iterdir()
        if (path / "__init__.py").exists()
    }
    assert set(_importlinter()["root_packages"]) == children
    (layers,) = [c for c in _importlinter()["contracts"] if c["name"].startswith("Layers:")]
    layered = [m.strip() for layer in layers["layers"] for m in layer.split("|")]
    assert sorted(layered) == sorted(children), "every child of agentpool sits in exactly one layer"


@pytest.mark.parametrize("container", ["agentpool.router", "agentpool.planner"])
def test_the_simulator_is_kept_off_every_live_module_of_a_service_with_a_pure_core(container: str) -> None:
    """The router and planner contracts list their live modules in the top layer (exhaustive, so a
    new module must be placed); the simulator's forbidden list must name exactly those."""
    contracts = _importlinter()["contracts"]
    (inner,) = [c for c in contracts if c.get("containers") == [container]]
    live = {f"{container}.{m.strip()}" for m in inner["layers"][0].split(":")}
    (sim,) = [c for c in contracts if c.get("source_modules") == ["agentpool.sim"]]
    forbidden = {m for m in sim["forbidden_modules"] if m.startswith(container + ".")}
    assert forbidden == live
