"""``kvplan compare`` says what its rows count (helper new15: retention off printed 'hit rate % 0.0' beside
'reuse rate % 99.7', and 'held KV' beside 'pinned KV', with no word on either)."""

from __future__ import annotations

from kvplan.app.cmd_compare import ROWS_NOTE, render_text


def _row(policy: str) -> dict:
    return {"policy": policy, "gpus": 16, "replications": 2, "seed": 0, "notes": [], "description": policy,
            "saturated": [], "hit_rate": 0.0, "reuse_rate": 0.997}


def test_rows_are_defined_under_the_table() -> None:
    text = render_text([_row("off"), _row("ttl")])
    labels = [ln.split("  ")[0] for ln in text]
    assert "hit rate %" in labels and "reuse rate %" in labels
    assert ROWS_NOTE in text and text.index(ROWS_NOTE) > labels.index("reuse rate %")
    for term in ("hit rate = ", "reuse rate = ", "pinned KV = ", "held KV = ", "errors = ", "preemptions = "):
        assert term in ROWS_NOTE


def test_recommended_column_says_which_recommend_it_ran() -> None:
    row = {**_row("ttl_recommended"), "description": "kvplan recommend's answer, which is retention off"}
    line = next(ln for ln in render_text([_row("off"), row]) if ln.startswith("ttl_recommended: "))
    assert "recommend run at this command's 2 replication(s), as `kvplan recommend --replications 2` runs it" in line
    assert "compare --replications 3 runs it as plain `kvplan recommend` does" in line
    assert not any("recommend run at" in ln for ln in render_text([_row("off")]))
