"""Time of the vLLM log-line patterns on hostile lines of 100 KB, 1 MB and 4 MB (issue 22 item 10: linear, a 1 MB
line in well under 1 s; the old patterns took 55 s on a 100 KB 'Declining expired remote read' line).

Parses each line with ``kvplan.calibration.parse_logs.parse_log`` (a refusal is an outcome too) and writes
benchmarks/results/log_lines.json with the milliseconds per line and size; a linear pattern grows about 10x
from 100 KB to 1 MB, a quadratic one about 100x.

    .venv/bin/python benchmarks/bench_log_lines.py
"""

from __future__ import annotations

import json
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kvplan.atomic import atomic_write_bytes
from kvplan.calibration.parse_logs import parse_log
from kvplan.errors import KvplanInputError

HERE = Path(__file__).resolve().parent
V = "INFO 05-11 23:40:01.123 [pull_scheduler.py:455] "
P = "2025-05-11 23:40:01,123 [INFO] proxy: "
LINES: dict[str, Callable[[int], str]] = {
    "decline engine spaces": lambda n: V + "Declining expired remote read for r1 from engine " + " " * n + "x",
    "decline engine a, spaces": lambda n: V + "Declining expired remote read for r1 from engine a" + " " * n + "x",
    "decline no engine": lambda n: V + "Declining expired remote read for " + "x" * n,
    "conv= runs": lambda n: P + "conv=" * (n // 5) + " cache HIT",
    "conv= colons": lambda n: P + "conv=" + "a:" * (n // 2) + " cache MISS",
    "brackets prefill": lambda n: P + "[" * n + " Prefill done in 5 ms",
    "kv pair spaces": lambda n: V + "KV Transfer metrics: a" + " " * n + ", b=1",
    "stats engine runs": lambda n: V + "Engine 0: " * (n // 10) + "Avg prompt throughput: 1 tokens/s",
}
SIZES = {"100 KB": 100 * 1024, "1 MB": 1024**2, "4 MB": 4 * 1024**2}


def main() -> None:
    """Time every hostile line at every size and write the results file."""
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in LINES.items():
            out[name] = {}
            for label, n in SIZES.items():
                path = Path(tmp) / "v.log"
                path.write_text(V + "Starting vLLM\n" + make(n) + "\n")
                t0 = time.perf_counter()
                try:
                    parse_log(path)
                except KvplanInputError:
                    pass
                out[name][label] = round((time.perf_counter() - t0) * 1000, 1)
            print(f"{name:24s} " + "  ".join(f"{k}: {v:7.1f} ms" for k, v in out[name].items()))
    report = {"machine": platform.platform(), "ms_per_line": out,
              "max_1mb_ms": max(v["1 MB"] for v in out.values())}
    atomic_write_bytes(HERE / "results" / "log_lines.json", (json.dumps(report, indent=2) + "\n").encode())
    print(f"slowest 1 MB line: {report['max_1mb_ms']:.0f} ms; wrote benchmarks/results/log_lines.json")


if __name__ == "__main__":
    main()
