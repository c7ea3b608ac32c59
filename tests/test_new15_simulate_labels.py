"""``kvplan simulate``'s table says what each count is (helper new15): 'miss 40' on 40 conversations read as 40
failures, 'D->P / P->D bytes' named no direction's purpose, and 'prefill utilisation 10.2%' (the whole run) sat beside
health's judgement on the steady window (31%) with nothing saying which was which."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import small

from kvplan.app.cli import main


def test_table_labels_say_what_they_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = tmp_path / "sc.yaml"
    sc.write_text(yaml.safe_dump(small()))
    assert main(["simulate", str(sc), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert "decisions per turn (miss: nothing retained, as on every first turn)" in out
    assert "D->P bytes (retained KV read back) / P->D (prompt KV to D)" in out
    rows = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in out.splitlines() if ln.count("│") == 3}
    assert rows["prefill utilisation (busy share, whole run)"] == f"{s['prefill_utilization']:.1%}"
    assert rows["prefill utilisation, steady window (busiest P; health judges this)"] == \
        f"{min(s['prefill_utilization_steady_max'], 1.0):.1%}"


def test_conversations_with_no_turn_are_counted_against_those_asked(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A fitted workload whose first prompts can exceed the context: summary.json said 48 conversations where the
    scenario asked for 60, and the note said only '17 conversations ended early'."""
    wl = {**small()["workload"], "conversations": 20,
          "prefix_tokens": {"dist": "empirical", "values": [1000, 50000]}}  # Qwen3-32B: 40,960 tokens
    sc = tmp_path / "sc.yaml"
    sc.write_text(yaml.safe_dump(small(workload=wl)))
    assert main(["simulate", str(sc), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    dropped = 20 - s["conversations"]
    assert 0 < dropped <= s["truncated_conversations"]
    note = next(ln for ln in out.splitlines() if ln.startswith("note: of those"))
    assert note.startswith(f"note: of those, {dropped} have no turn at all (even the first prompt + output is over "
                           f"40,960 tokens): {s['conversations']} of the 20 conversations asked for")
