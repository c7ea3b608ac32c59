"""Invariants and mutations the rest of the suite let through (issue 23, item 5).

Each test here fails when one specific piece of core behaviour is changed:

- the connector's threshold test is strict (``0 < tokens_to_pull < kv_recompute_threshold`` recomputes,
  ``tokens_to_pull >= threshold`` pulls: ``pull_scheduler.py``, VLLM_BEHAVIOUR.md), so a pull of exactly
  ``threshold`` tokens happens and one of ``threshold - 1`` does not;
- two reads in flight on the default 1P1D link share its line rate (no fabric bookkeeping there,
  ``sim/context.py`` :: ``Ctx.link``), so each takes twice as long as one alone;
- every ``file :: name`` of ``docs/ARCHITECTURE.md``'s "where each behaviour lives" table exists.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import numpy as np
from conftest import full_costs, small

from kvplan.sim.api import run

ROOT = Path(__file__).resolve().parents[1]


def _two_turns(threshold: int) -> dict[str, Any]:
    wl = {"conversations": 1, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
          "turns": {"dist": "constant", "value": 2}, "prefix_tokens": {"dist": "constant", "value": 1000},
          "user_tokens": {"dist": "constant", "value": 100}, "output_tokens": {"dist": "constant", "value": 100},
          "turn_gap_s": {"dist": "constant", "value": 1.0}}
    return small(workload=wl, policy={"bidirectional": True, "kv_recompute_threshold_tokens": threshold})


def test_threshold_is_strict_below() -> None:
    """A pull of exactly ``threshold`` tokens is made; ``threshold + 1`` recomputes (kills ``<`` -> ``<=``)."""
    base = run(_two_turns(64)).turns
    second = base[base["turn"] == 2].iloc[0]
    assert second["decision"] == "pull"
    n = int(second["pulled_tokens"])
    assert n > 64
    at = run(_two_turns(n)).turns
    assert at[at["turn"] == 2].iloc[0]["decision"] == "pull"
    assert int(at[at["turn"] == 2].iloc[0]["pulled_tokens"]) == n
    above = run(_two_turns(n + 1)).turns
    row = above[above["turn"] == 2].iloc[0]
    assert row["decision"] == "recompute_below_threshold" and row["pulled_tokens"] == 0


def test_two_reads_share_the_default_1p1d_link() -> None:
    """1P1D (no fabric): two P->D reads posted at the same instant each take twice one read's time."""
    wl = {"conversations": 2, "arrival": {"kind": "closed_loop", "clients": 2, "max_active_conversations": 2},
          "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 20_000},
          "user_tokens": {"dist": "constant", "value": 0}, "output_tokens": {"dist": "constant", "value": 5}}
    costs = full_costs(transfer={"per_byte_s": 1 / 5e9})  # bytes only
    one = run(small(workload={**wl, "conversations": 1, "arrival": {"kind": "closed_loop", "clients": 1,
                                                                     "max_active_conversations": 1}}, costs=costs))
    two = run(small(workload=wl, deployment={"max_num_batched_tokens": 65536}, costs=costs))
    assert set(two.turns["d_node"]) == {0} and set(two.turns["p_node"]) == {0}
    t1 = one.turns["p2d_transfer_s"].iloc[0]
    assert t1 > 0
    np.testing.assert_allclose(two.turns["p2d_transfer_s"].to_numpy(), [2 * t1, 2 * t1], rtol=1e-9)


def _table_rows() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Where each vLLM behaviour lives", 1)[1].split("\n## ", 1)[0]
    out: list[tuple[str, str]] = []
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("|---") or "file :: function" in line:
            continue
        cell = line.rstrip().rstrip("|").rsplit("|", 1)[1]
        for part in cell.split(";"):
            m = re.match(r"\s*`([^`]+)`\s*::\s*(.*)", part)
            assert m, f"row without `file` :: name: {line}"
            for name in re.findall(r"`([^`]+)`", m.group(2)):
                out.append((m.group(1), name))
    return out


def _defined(path: Path) -> set[str]:
    """Every top-level name and Class.method of a module (module-level functions also as bare names)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(f"{node.name}.{sub.name}")
                    names.add(sub.name)
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_architecture_table_names_exist() -> None:
    rows = _table_rows()
    assert len(rows) >= 16
    missing = [f"{f} :: {n}" for f, n in rows if not (ROOT / f).exists() or n.split("(")[0] not in _defined(ROOT / f)]
    assert not missing, f"docs/ARCHITECTURE.md names what does not exist: {missing}"


def test_fcfs_within_the_prefill_queue() -> None:
    """Invariant: P's waiting queue is FCFS (vLLM V1 ``Scheduler.schedule``): with equal prompts on a saturated P,
    requests start their prefill in arrival order."""
    wl = {"conversations": 80, "arrival": {"kind": "poisson", "rate_per_s": 40.0},
          "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 6000},
          "user_tokens": {"dist": "constant", "value": 0}, "output_tokens": {"dist": "constant", "value": 4}}
    t = run(small(workload=wl, deployment={"max_num_seqs": 4, "prefill_prefix_caching": False})).turns
    t = t.sort_values("arrival_s", kind="stable")
    started = (t["arrival_s"] + t["overhead_s"] + t["prefill_queue_s"]).to_numpy()
    assert t["prefill_queue_s"].max() > 1.0  # saturated: the queue decides the order
    assert (np.diff(started) >= -1e-9).all()
