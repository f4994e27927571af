"""One namespace package ``agentpool`` spread over three source roots (setuptools cannot express
that in pyproject.toml alone): every package found under a root maps to its own directory."""

from pathlib import Path

from setuptools import find_namespace_packages, setup

SOURCE_ROOTS = ("controlplane", "operator", "engine-image")

packages: list[str] = []
package_dir: dict[str, str] = {}
for root in SOURCE_ROOTS:
    for pkg in find_namespace_packages(root, include=["agentpool.*"]):
        if "__pycache__" in pkg:
            continue
        packages.append(pkg)
        package_dir[pkg] = str(Path(root, *pkg.split(".")))

setup(packages=packages, package_dir=package_dir)
