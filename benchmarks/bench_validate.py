"""Time of ``kvplan validate`` on this machine (issue 9, acceptance 5: offline, under 2 minutes).

Runs exactly the documented command (``kvplan validate --json``) in a fresh process (imports included, as a
user would time it), twice, checks that both runs print byte-identical JSON, and writes
benchmarks/results/validate.json with the wall times and each case's summary (status, points predicted,
MAPE, max error), its sensitivity band (measurements inside it, knife edges; ``validate_band``: two more
simulations per serving run) and its seed spread (measurements within it; three more simulations per serving
setup).

    .venv/bin/python benchmarks/bench_validate.py
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvplan.atomic import atomic_write_bytes

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LIMIT_S = 120.0


def main() -> None:
    """Run the benchmark and write the results file."""
    kvplan = Path(sys.executable).with_name("kvplan")
    cmd = [str(kvplan), "validate", "--json"]
    walls, digests, out = [], [], ""
    for _ in range(2):
        t = time.perf_counter()
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
        walls.append(time.perf_counter() - t)
        out = proc.stdout
        digests.append(hashlib.sha256(out.encode()).hexdigest())
    cases = json.loads(out)["cases"]
    case_rows: list[dict[str, Any]] = [
        {"name": c["name"], "status": c["status"], "profile": c["profile"], **c["summary"],
         "band_inside": (c["band"] or {}).get("inside"), "band_points": (c["band"] or {}).get("points_with_band"),
         "knife_edges": len((c["band"] or {}).get("knife_edges", [])),
         "seed_inside": (c["seed_spread"] or {}).get("inside"),
         "seed_points": (c["seed_spread"] or {}).get("points_with_spread"),
         "seed_deterministic": (c["seed_spread"] or {}).get("deterministic")} for c in cases
    ]
    result: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "processor": platform.machine(), "cpus": os.cpu_count()},
        "command": "kvplan validate --json",
        "wall_s": walls,
        "limit_s": LIMIT_S,
        "under_limit": max(walls) < LIMIT_S,
        "deterministic": digests[0] == digests[1],
        "cases": case_rows,
    }
    dest = HERE / "results" / "validate.json"
    dest.parent.mkdir(exist_ok=True)
    atomic_write_bytes(dest, (json.dumps(result, indent=2) + "\n").encode(), ledger=False)  # a file of the repository
    print(f"kvplan validate --json: {min(walls):.2f}-{max(walls):.2f} s (limit {LIMIT_S:.0f} s), "
          f"deterministic: {result['deterministic']}")
    for c in case_rows:
        mape = f"{c['mape_pct']:.1f}%" if c["mape_pct"] is not None else "-"
        band = f", band: {c['band_inside']}/{c['band_points']} inside, {c['knife_edges']} knife edges" \
            if c["band_points"] else ""
        seeds = "" if not c["seed_points"] else (
            ", seeds 0-3: no random part" if c["seed_deterministic"]
            else f", seeds 0-3: {c['seed_inside']}/{c['seed_points']} within")
        print(f"  {c['name']}: {c['status']}, {c['predicted']}/{c['points']} predicted, MAPE {mape}{band}{seeds}")
    print(f"wrote {dest.relative_to(REPO)}")


if __name__ == "__main__":
    main()
