"""``kvplan capacity`` names the deployment to choose first (helper new15: it printed three answers, P/D with and
without bidirectional transfer and aggregated replicas, each with its cost, and no word on which to deploy or how
close to the SLO it ran)."""

from __future__ import annotations

from typing import Any

from kvplan.app.cmd_capacity import answer_line, render_text
from kvplan.plan.capacity import CapacityPlan


def _answer(xpyd: str, usd: float | None, meets: bool = True, p90_ms: float = 1500.0,
            neighbours: tuple[bool, ...] = (False,)) -> dict[str, Any]:
    return {"meets_slo": meets, "xpyd": xpyd, "usd_per_million_turns_at_rate": usd, "billed_nodes": 2.0,
            "ttft_p90_ms": p90_ms, "gpus": 16, "hit_rate": 0.5, "note": "no size up to 16 nodes meets the SLO",
            "neighbour_checks": [{"xpyd": "1P1D", "meets_slo": n, "ttft_p90_ms": 2500.0} for n in neighbours],
            "verification": {"seeds": [1, 2], "overrides": {}}, "routing": "round_robin", "first_run_conversations": 40}


def _plan(on: dict, off: dict, agg: dict) -> CapacityPlan:
    return CapacityPlan(rate_per_s=0.2, slo_ttft_p90_ms=2000.0, usd_per_node_hour=55.04, turns_per_conversation=9.8,
                        with_bidirectional=on, without_bidirectional=off, aggregated=agg)


def test_cheapest_answer_first_with_its_margin() -> None:
    plan = _plan(_answer("2P1D", 25034.0), _answer("1P1D", 16601.0, p90_ms=1910.0), _answer("2 aggregated", 30000.0))
    text = render_text(plan, "s.yaml")
    assert text[1] == ("answer: 1P1D with bidirectional off ($16,601 per million turns; TTFT p90 1.91 s = 96% of the "
                       "SLO, the mean of 2 replication(s); one instance fewer misses it); also meeting it: 2P1D with "
                       "bidirectional on ($25,034), 2 aggregated replica(s) ($30,000)")


def test_no_price_ranks_by_nodes_and_nothing_met_says_what_to_change() -> None:
    cheap = {**_answer("1 aggregated", None), "billed_nodes": 1.0}
    assert answer_line(_plan(_answer("2P1D", None), _answer("1P1D", None, meets=False), cheap)).startswith(
        "answer: 1 aggregated replica(s) (1 node(s), no price known;")
    none = answer_line(_plan(*(_answer("x", 1.0, meets=False) for _ in range(3))))
    assert none.startswith("answer: no deployment considered meets the SLO") and "--max-nodes" in none
