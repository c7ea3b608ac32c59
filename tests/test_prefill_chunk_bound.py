"""Every prompt is prefilled in ``max_num_batched_tokens``-token engine steps, each an event: ``max_num_batched_tokens:
1`` made a 30,000-token prompt 30,000 steps, so a valid-looking scenario could cost days. A run whose prompts split
into more than ``MAX_PREFILL_CHUNKS`` steps is refused before it starts, naming the field and the fix."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kvplan.app.cli import main
from kvplan.errors import KvplanInputError
from kvplan.sim import validity
from kvplan.sim.api import run
from kvplan.sim.validity import MAX_PREFILL_CHUNKS, check_prefill_chunk_cost


def test_the_bound_counts_chunks_at_the_step_budget() -> None:
    plan = SimpleNamespace(prompt_tokens=np.array([MAX_PREFILL_CHUNKS // 2 + 1, MAX_PREFILL_CHUNKS // 2], dtype=np.int64))
    with pytest.raises(KvplanInputError, match=r"^deployment\.max_num_batched_tokens: 1 tokens per step split this run's "
                       r"prompts into up to 1,000,000,001 prefill steps .*; raise it \(vLLM's default is 8192\)"):
        check_prefill_chunk_cost(plan, 1)
    check_prefill_chunk_cost(plan, 2)  # ceil halves: 500,000,001 + 500,000,000 / 2
    check_prefill_chunk_cost(SimpleNamespace(prompt_tokens=np.array([], dtype=np.int64)), 1)


def test_a_run_over_the_bound_is_refused_before_it_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    sc = {"deployment": {"max_num_seqs": 1, "max_num_batched_tokens": 100},
          "workload": {"conversations": 3, "turns": {"dist": "constant", "value": 1},
                       "prefix_tokens": {"dist": "constant", "value": 1000}, "user_tokens": {"dist": "constant",
                                                                                            "value": 0}}}
    assert run(sc).summary["turns"] == 3  # 3 prompts x 10 chunks
    monkeypatch.setattr(validity, "MAX_PREFILL_CHUNKS", 29)
    path = tmp_path / "s.yaml"
    path.write_text("deployment: {max_num_seqs: 1, max_num_batched_tokens: 100}\nworkload: {conversations: 3, turns: "
                    "{dist: constant, value: 1}, prefix_tokens: {dist: constant, value: 1000}, user_tokens: {dist: "
                    "constant, value: 0}}\n")
    assert main(["simulate", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: deployment.max_num_batched_tokens: 100 tokens per step split this run's prompts into "
                          "up to 30 prefill steps") and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
