"""Generate the gRPC stubs and the CRD, or check (``--check``) that the committed ones are fresh.

Protos under ``proto/`` compile into ``controlplane/`` (so ``agentpool/v1/x.proto`` becomes the
module ``agentpool.v1.x_pb2``); the CRD comes from the pydantic spec in ``agentpool.api``.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
STUB_ROOT = ROOT / "controlplane"
STUB_DIR = STUB_ROOT / "agentpool" / "v1"
CRD_DIR = ROOT / "crds"
CHART_CRD_DIR = ROOT / "charts" / "agentpool" / "crds"  # the Helm chart ships the same CRD
SPEC_DOC = ROOT / "docs" / "spec.md"


def generate_into(stub_root: Path, crd_dir: Path, spec_doc: Path) -> None:
    stub_root.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    if protos:
        cmd = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"--python_out={stub_root}",
            f"--pyi_out={stub_root}",
            f"--grpc_python_out={stub_root}",
            *protos,
        ]
        subprocess.run(cmd, check=True, cwd=ROOT)
    crd_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "agentpool.api.crd", "--out-dir", str(crd_dir)], check=True, cwd=ROOT
    )
    subprocess.run([sys.executable, "-m", "agentpool.api.docs", "--out", str(spec_doc)], check=True, cwd=ROOT)


def generated_files(
    stub_dir: Path, crd_dir: Path, spec_doc: Path, chart_crd_dir: Path | None = None
) -> dict[str, Path]:
    files = {f"stubs/{p.name}": p for p in stub_dir.glob("*_pb2*.py*")}
    files.update({f"crds/{p.name}": p for p in crd_dir.glob("*.yaml")})
    files.update({f"chart/crds/{p.name}": p for p in (chart_crd_dir or crd_dir).glob("*.yaml")})
    if spec_doc.exists():
        files["docs/spec.md"] = spec_doc
    return files


def check() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tmp_root = Path(tmp)
        generate_into(tmp_root / "stubs", tmp_root / "crds", tmp_root / "spec.md")
        fresh_stubs = tmp_root / "stubs" / "agentpool" / "v1"
        fresh = generated_files(fresh_stubs, tmp_root / "crds", tmp_root / "spec.md")
        committed = generated_files(STUB_DIR, CRD_DIR, SPEC_DOC, CHART_CRD_DIR)
        problems = sorted(set(fresh) ^ set(committed))
        problems += [
            k
            for k in sorted(set(fresh) & set(committed))
            if not filecmp.cmp(fresh[k], committed[k], shallow=False)
        ]
        if problems:
            print("generated files are stale; run `make generate`:", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            return 1
    print("generated files are up to date")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    if args.check:
        return check()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_root = Path(tmp)
        generate_into(tmp_root / "stubs", CRD_DIR, SPEC_DOC)
        CHART_CRD_DIR.mkdir(parents=True, exist_ok=True)
        for p in CRD_DIR.glob("*.yaml"):
            shutil.copy2(p, CHART_CRD_DIR / p.name)
        STUB_DIR.mkdir(parents=True, exist_ok=True)
        for p in (tmp_root / "stubs" / "agentpool" / "v1").glob("*"):
            shutil.copy2(p, STUB_DIR / p.name)
    print("generated stubs in", STUB_DIR.relative_to(ROOT), "and CRDs in", CRD_DIR.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
