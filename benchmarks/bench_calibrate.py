"""Time of the simulation-based calibration of the shipped profiles (issue 3, acceptance 5).

Runs exactly what the documented command runs (``kvplan calibrate --published
calibration/data/p5en_published.csv --model M --hardware p5en --out models/profiles/p5en-M.json``) for both
models, in a fresh process each (imports included, as a user would time it), twice, and checks that the
two runs write byte-identical profiles and that they equal the shipped ones. Writes
benchmarks/results/calibrate.json. The requirement is < 5 minutes on 2 cores; the fit is single-threaded.

    .venv/bin/python benchmarks/bench_calibrate.py
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CSV = REPO / "calibration" / "data" / "p5en_published.csv"
MODELS = ("qwen3-32b", "glm-5-fp8")
LIMIT_S = 300.0


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    """Run the benchmark and write the results file."""
    kvplan = Path(sys.executable).with_name("kvplan")
    runs = []
    total = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            digests = []
            walls = []
            for rep in range(2):
                out = Path(tmp) / f"{model}-{rep}.json"
                cmd = [str(kvplan), "calibrate", "--published", str(CSV), "--model", model, "--hardware", "p5en",
                       "--out", str(out), "--json"]
                t = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
                walls.append(time.perf_counter() - t)
                digests.append(_sha(out))
                report = json.loads(out.read_text())["fit_report"]
            shipped = REPO / "models" / "profiles" / f"p5en-{model}.json"
            row = {
                "model": model,
                "wall_s": walls,
                "evaluations": report["optimizer"]["nfev"],
                "deterministic": digests[0] == digests[1],
                "equals_shipped_profile": shipped.is_file() and _sha(shipped) == digests[0],
                "all_points_within_tolerance": report["all_within_tolerance"],
            }
            total += walls[0]
            runs.append(row)
            print(f"{model}: {walls[0]:.1f} s / {walls[1]:.1f} s ({row['evaluations']} evaluations), deterministic "
                  f"{row['deterministic']}, equals shipped {row['equals_shipped_profile']}")
    result = {
        "machine": {
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
        "command": "kvplan calibrate --published calibration/data/p5en_published.csv --model M --hardware p5en "
        "--out models/profiles/p5en-M.json",
        "runs": runs,
        "total_wall_s_both_models": total,
        "limit_s": LIMIT_S,
        "meets_limit": total < LIMIT_S,
    }
    (HERE / "results").mkdir(exist_ok=True)
    dest = HERE / "results" / "calibrate.json"
    tmp_dest = dest.with_suffix(".tmp")
    tmp_dest.write_text(json.dumps(result, indent=2) + "\n")
    tmp_dest.replace(dest)
    print(f"both models: {total:.1f} s (limit {LIMIT_S:.0f} s); wrote {dest}")


if __name__ == "__main__":
    main()
