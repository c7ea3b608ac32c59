"""recommend says how sure its TTL is, under the headline (helper new15: the table's columns, 362.9 ±59.3 ms
recommended against 370.0 ±56.6 ms bidirectional off, overlap while the paired gain the TTL rule judged, 7.1 ±4.2 ms,
is clear; the text never printed that gain or its CI)."""

from __future__ import annotations

from typing import Any

from kvplan.app.cmd_recommend import gain_line
from kvplan.plan.advice import Recommendation


def _rec(curve: list[dict[str, Any]], ttl: int = 45, reps: int = 3) -> Recommendation:
    return Recommendation(bidirectional=True, decoder_kv_blocks_ttl_s=ttl, kv_recompute_threshold_tokens=282,
                          router_ttl_s=38, kv_load_failure_policy="recompute", kv_transfer_config={}, router={},
                          expected={}, baseline={}, bidirectional_off={}, decode_hbm={}, binding_constraint="",
                          rationale=(), ttl_curve=tuple(curve), inputs={"replications": reps})


def test_gain_and_its_ci_at_the_recommended_ttl() -> None:
    curve = [{"ttl_s": 30.0, "benefit_s": 0.0066, "benefit_ci95": 0.00508},
             {"ttl_s": 45.0, "benefit_s": 0.0071, "benefit_ci95": 0.00419}]
    assert gain_line(_rec(curve)) == [
        "gain: mean TTFT 7.1 ms lower than with bidirectional off at TTL 45 s (95% CI ±4.2 ms over 3 paired "
        "replications: a real gain; the TTL sweep's runs, common random numbers)"]


def test_a_gain_within_the_noise_says_so_and_no_row_no_line() -> None:
    (line,) = gain_line(_rec([{"ttl_s": 45.0, "benefit_s": 0.0037, "benefit_ci95": 0.0052}]))
    assert line.endswith("(95% CI ±5.2 ms over 3 paired replications: it includes no gain; the TTL sweep's runs, "
                         "common random numbers)")
    assert gain_line(_rec([{"ttl_s": 30.0, "benefit_s": 0.0066, "benefit_ci95": 0.005}])) == []
