"""The stall shape of the llm-d exp-7 runs, from their summary ITL statistics (the validation cases' evidence).

Each ``benchmark_serving --save-result`` JSON has the mean, standard deviation and median of the inter-token
latencies. Read them as two levels, a plain decode step at the median ``b`` and a stall of length ``S`` taking a
share ``f`` of the gaps: ``mean = b (1 - f) + f S`` and ``std^2 + mean^2 = b^2 (1 - f) + f S^2``, solved for ``S``
and ``f`` by fixed-point iteration. ``f x output tokens / (request decode time)`` is the stalls a decoding request
sees per second. The plain replicas' stalls are steps carrying an 8192-token prefill chunk; the llm-d "1P1D" and
"2P1D" runs show the same ~600 ms stall at the same rate as the plain replicas of the same workload (what
aggregated replicas with random routing give), for 8370- and 10463-token prompts alike (a KV read's cost would
grow 25% with its bytes).
A diagnostic of the case files' claim, not a fit: nothing here feeds a prediction.

    .venv/bin/python benchmarks/derive_llmd_itl_stalls.py [DIR]
    # DIR: ../shared/external_traces/llmd_pd_benchmark_serving_a100 (the default)

Writes benchmarks/results/llmd_itl_stalls.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parent.parent / "shared" / "external_traces" / "llmd_pd_benchmark_serving_a100"
OUT = HERE / "results" / "llmd_itl_stalls.json"


def two_level(mean: float, std: float, median: float, rounds: int = 500) -> tuple[float, float]:
    """``(S, f)``: the stall length and the share of gaps stalled that give this mean and std over a median step."""
    second = std * std + mean * mean
    f = 0.1
    stall = mean
    for _ in range(rounds):
        stall = (second - median * median * (1 - f)) / (mean - median * (1 - f))
        f = (mean - median) / (stall - median)
    return stall, f


def row(path: Path) -> dict[str, float | str]:
    """One run's summary ITL statistics and its two-level reading."""
    d = json.loads(path.read_text(encoding="utf-8"))
    mean, std, med = d["mean_itl_ms"], d["std_itl_ms"], d["median_itl_ms"]
    stall, f = two_level(mean, std, med)
    out_tokens = d["total_output_tokens"] / d["completed"]
    decode_s = out_tokens * mean / 1000.0
    stalls_per_s = f * out_tokens / decode_s
    rate = d["completed"] / d["duration"]
    return {"run": path.stem, "mean_itl_ms": mean, "std_itl_ms": std, "median_itl_ms": med,
            "p99_itl_ms": d["p99_itl_ms"], "stall_ms": round(stall, 1), "stalled_gap_share": round(f, 4),
            "stalls_per_request_s": round(stalls_per_s, 3), "completed_per_s": round(rate, 3),
            "requests_per_stall": round(rate / stalls_per_s, 2)}


def main() -> None:
    """Print and write the table."""
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    files = sorted(src.glob("*__benchmark_*.json"))
    if not files:
        sys.exit(f"no llm-d benchmark JSONs in {src} (give the llmd_pd_benchmark_serving_a100 folder)")
    rows = [row(p) for p in files]
    for r in rows:
        print(f"{r['run']:<46} stall {r['stall_ms']:6.1f} ms, {r['stalled_gap_share']:.3f} of gaps, "
              f"{r['stalls_per_request_s']:.2f}/s per decoding request at {r['completed_per_s']:.2f} req/s "
              f"({r['requests_per_stall']:.2f} requests per stall)")
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"source": str(src.name), "runs": rows}, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
