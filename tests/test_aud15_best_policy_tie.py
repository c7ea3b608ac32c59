"""aud15: a best policy that ties with the lowest TTFT p90 only through a wide interval says so. recommend on
Llama-3.3-70B 2P2D (P at TP4) with 2 replications named 'off' best (TTFT p90 1.67 s) under a recommendation to keep
bidirectional on (0.62 s) and beside aggregated's 0.52 s: with 2 replications the paired difference, +1.15 s, has a 95%
interval of +-1.21 s, so the rule ties them and the tie went to list order, with an empty 'why'."""

from __future__ import annotations

from typing import Any

from kvplan.plan.compare_rules import best_policy


def _row(policy: str, reps: list[float]) -> dict[str, Any]:
    return {"policy": policy, "ttft_p90_s": sum(reps) / len(reps), "ttft_p90_s_by_replication": reps,
            "ttft_p90_s_ci95": 0.0, "pinned_kv_gib_mean": 0.0, "pinned_kv_gib_peak": 0.0, "errors": 0.0,
            "turns": 1000, "hit_rate": 0.0, "usd_per_million_turns": 1000.0}


def test_a_tie_by_the_interval_only_is_said() -> None:
    rows = [_row("off", [1.0, 2.3]), _row("ttl_recommended", [0.55, 0.69]), _row("aggregated", [0.5, 0.53])]
    best = best_policy(rows)
    assert best["policy"] == "off" and best["lowest_ttft_p90_policy"] == "aggregated"  # the rule, unchanged
    why = best["why"]
    assert why.startswith("off ties with the lowest TTFT p90 (aggregated, 515.0 ms) only by the width of the 95% "
                          "interval over 2 replication(s)"), why
    assert "1.13 s" in why and "220%" in why and "--replications" in why


def test_a_practical_tie_or_the_lowest_itself_says_nothing() -> None:
    assert best_policy([_row("off", [0.5, 0.531]), _row("aggregated", [0.5, 0.53])])["why"] == ""  # within 1%
    assert best_policy([_row("off", [0.9, 0.91]), _row("aggregated", [0.5, 0.53])])["why"] == ""  # the lowest wins
