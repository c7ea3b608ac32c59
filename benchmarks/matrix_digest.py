"""Digests of every output file of the native test matrix (``tests/test_native.py``), for refactors.

A refactor that must keep outputs byte-identical (issue 23) runs this before and after and compares:

    python benchmarks/matrix_digest.py --out before.json        # on the old code
    python benchmarks/matrix_digest.py --out after.json --against before.json   # exit 1 on any difference

Each scenario runs in-process through ``kvplan simulate --format both`` in pure Python (``KVPLAN_NATIVE=0``,
set before ``kvplan`` is imported) unless ``--native``. Trace files are copied to one fixed temporary path so
that a scenario's recorded trace path, and so its outputs, do not depend on where the checkout lives; each run
writes its results in its own folder, so concurrent runs do not collide.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXED = Path("/tmp") / "kvplan-matrix-digest"  # fixed, not $TMPDIR: the trace path is recorded in the outputs


def _rewrite_traces(sc: dict[str, Any], traces: Path) -> dict[str, Any]:
    tr = sc.get("workload", {}).get("trace")
    if isinstance(tr, dict) and "path" in tr:
        src = Path(tr["path"])
        dst = traces / src.name
        tmp = traces / f".{src.name}.{os.getpid()}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)  # atomic: a concurrent run never reads a half-copied trace
        sc = {**sc, "workload": {**sc["workload"], "trace": {**tr, "path": str(dst)}}}
    return sc


def digests(native: bool, keep: Path | None = None) -> dict[str, dict[str, str]]:
    """scenario name -> output file name -> sha256, for every scenario of the native test matrix (``keep``: a
    directory the result directories are copied into, to read what differs)."""
    if not native:
        os.environ["KVPLAN_NATIVE"] = "0"
    sys.path.insert(0, str(ROOT / "tests"))
    import test_native  # noqa: PLC0415 - the matrix lives with its test
    import yaml  # noqa: PLC0415

    from kvplan.app.cli import main  # noqa: PLC0415

    (FIXED / "traces").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=FIXED))  # concurrent runs share only the trace copies
    out: dict[str, dict[str, str]] = {}
    for name, sc in sorted(test_native._scenarios().items()):
        sc = _rewrite_traces(sc, FIXED / "traces")
        path = work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(sc, sort_keys=True))
        res_dir = work / name
        rc = main(["simulate", str(path), "--out", str(res_dir), "--format", "both"])
        if rc not in (0, None):
            raise SystemExit(f"{name}: kvplan simulate exited {rc}")
        out[name] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(res_dir.iterdir()) if p.is_file()}
        print(f"{name}: {len(out[name])} files", flush=True)
        if keep is not None:
            shutil.copytree(res_dir, keep / name, dirs_exist_ok=True)
    shutil.rmtree(work)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--against", type=Path, help="a previous --out: exit 1 when any digest differs")
    ap.add_argument("--native", action="store_true", help="use the compiled build when it is current")
    ap.add_argument("--keep", type=Path, help="copy every scenario's result directory into this directory")
    a = ap.parse_args()
    got = digests(a.native, a.keep)
    a.out.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    if a.against is None:
        return 0
    want = json.loads(a.against.read_text())
    diff = [f"{n}/{f}" for n in sorted(set(want) | set(got)) for f in sorted(set(want.get(n, {})) | set(got.get(n, {})))
            if want.get(n, {}).get(f) != got.get(n, {}).get(f)]
    print("byte-identical" if not diff else "DIFFERENT: " + ", ".join(diff))
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
