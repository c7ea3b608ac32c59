"""Aggregated replicas routed blind to where a conversation's KV is lose their prefix cache as D's do: a follow-up on
another replica recomputes its whole context. The health section's routing check covered P/D only (left15's note);
it now says so for aggregated serving too, with the same fix, and the run rows recommend and compare read count the
replica's own hits (``local_hit_tokens``: an aggregated run has no D hit)."""

from __future__ import annotations

from typing import Any

from kvplan.plan.advice_report import routing_note
from kvplan.plan.executor import run_extras
from kvplan.sim.api import run
from kvplan.sim.health import ROUTING_FIX
from kvplan.sim.scenario import scenario_from_dict


def _agg(routing: str, replicas: int = 4) -> Any:
    return scenario_from_dict({
        "model": "qwen3-32b", "hardware": "p5en", "policy": {"bidirectional": False},
        "deployment": {"mode": "aggregated", "replicas": replicas, "routing": routing, "prefill_prefix_caching": True},
        "workload": {"conversations": 40, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                     "turns": {"dist": "constant", "value": 4}, "prefix_tokens": {"dist": "constant", "value": 3000},
                     "user_tokens": {"dist": "constant", "value": 100}, "output_tokens": {"dist": "constant", "value": 50},
                     "turn_gap_s": {"dist": "constant", "value": 5}}})


def _routing(summary: dict[str, Any]) -> list[str]:
    return [w for w in summary["health"]["warnings"] if w.startswith("routing ")]


def test_round_robin_replicas_are_warned_and_counted_on_their_own_hits() -> None:
    sc = _agg("round_robin")
    rr = run(sc)
    (w,) = _routing(rr.summary)
    assert w.startswith("routing round_robin over 4 replicas: ") and ROUTING_FIX in w and "recomputed the rest" in w
    follow = rr.turns[(rr.turns["turn"] >= 2) & (rr.turns["decision"] != "error")]
    missed = int((2 * follow["local_hit_tokens"] < follow["prompt_tokens"]).sum())
    assert f"({missed} of {len(follow)})" in w and missed > 0.1 * len(follow)
    extras = run_extras(rr)
    assert extras["follow_up_d_missed_fraction"] == missed / len(follow)
    note = routing_note(sc, [{**extras, "error": None}])
    assert note is not None and note.startswith("routing round_robin over 4 replicas: ")


def test_kv_aware_replica_routing_is_not_warned() -> None:
    assert not _routing(run(_agg("session_affinity")).summary)
    assert not _routing(run(_agg("round_robin", replicas=1)).summary)
