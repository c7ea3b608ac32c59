"""`kvplan sweep --resume` on damaged parts (helper in15).

A part file (``OUT.parts/NNNNNN/P-K.json``) edited or damaged after kvplan wrote it reached the results: a metric that
is text ended the resume in a traceback (``float('x')`` while assembling), and ``{"error": null}`` (a finished run
with no metric) went into ``OUT.parquet`` as a row of NaN presented as complete. Each part now carries a checksum of
its row, and every part (an older kvplan's too, without one) is checked on reading: a one-line error naming the file
and the fix (delete it: --resume recomputes that run).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from kvplan.errors import KvplanInputError
from kvplan.plan.grid import grid_from_dict
from kvplan.plan.sweep import PartStore, run_grid

PART_DIGEST_KEY = "_sha256"  # plan.sweep.PART_DIGEST_KEY

BASE: dict[str, Any] = {
    "model": "qwen3-32b",
    "hardware": "p5en",
    "deployment": {"max_num_seqs": 64},
    "policy": {"bidirectional": True},
    "workload": {
        "conversations": 10,
        "arrival": {"kind": "poisson", "rate_per_s": 1.0},
        "turns": {"dist": "constant", "value": 2},
        "prefix_tokens": {"dist": "constant", "value": 1000},
        "user_tokens": {"dist": "constant", "value": 100},
        "output_tokens": {"dist": "constant", "value": 20},
        "turn_gap_s": {"dist": "exponential", "mean": 5},
    },
    "seed": 3,
}
GRID: dict[str, Any] = {"base": BASE, "axes": {"policy.decoder_kv_blocks_ttl_s": [30, 60]}, "replications": 1}


def _store(tmp_path: Path) -> tuple[Path, PartStore]:
    out = tmp_path / "r.parquet"
    store = PartStore(out, grid_from_dict(GRID))
    store.open(False)
    return out, store


def _part(store: PartStore, point: int = 0, rep: int = 0) -> Path:
    return store.dir / "000000" / f"{point}-{rep}.json"


def test_a_part_is_written_with_its_checksum_and_a_clean_resume_matches_a_fresh_sweep(tmp_path: Path) -> None:
    ref = run_grid(GRID, out=tmp_path / "ref.parquet", workers=1)
    out, store = _store(tmp_path)
    row = {k: (None if isinstance(v, float) and v != v else v) for k, v in ref.iloc[0].to_dict().items()}
    metrics = {k: v for k, v in row.items() if k not in ("point", "replication", "seed",
                                                           "policy.decoder_kv_blocks_ttl_s")}
    store.commit(0, 0, json.loads(json.dumps(metrics)))
    data = json.loads(_part(store).read_text())
    assert PART_DIGEST_KEY in data
    df = run_grid(GRID, out=out, workers=1, resume=True)
    assert PART_DIGEST_KEY not in df.columns
    pd.testing.assert_frame_equal(df, ref)
    assert out.read_bytes() == (tmp_path / "ref.parquet").read_bytes()


def test_an_edited_part_is_refused_by_its_checksum(tmp_path: Path) -> None:
    out, store = _store(tmp_path)
    store.commit(0, 0, {"error": None, "ttft_p90_s": 0.5})
    data = json.loads(_part(store).read_text())
    data["ttft_p90_s"] = 0.1  # a plausible number: only the checksum tells
    _part(store).write_text(json.dumps(data))
    with pytest.raises(KvplanInputError, match=r"0-0\.json: was changed after kvplan sweep wrote it .*delete that file"):
        run_grid(GRID, out=out, workers=1, resume=True)
    assert _part(store).exists()  # never deleted


@pytest.mark.parametrize(("content", "needle"), [
    ({"error": None, "ttft_p90_s": "x"}, "field 'ttft_p90_s' is 'x', not a number"),
    ({"error": None, "turns": True}, "field 'turns' is True, not a number"),
    ({"error": None, "turns": [1, 2]}, "field 'turns' is [1, 2], not a number"),
    ({"error": 5}, "field 'error' is int, not text or null"),
    ({"error": None}, "holds a finished run without any metric"),
], ids=["text metric", "bool metric", "list metric", "int error", "no metric"])
def test_a_damaged_part_without_checksum_is_refused_in_one_line(tmp_path: Path, content: dict[str, Any],
                                                                  needle: str) -> None:
    out, store = _store(tmp_path)
    store.commit(0, 0, {"error": None, "x": 1})
    _part(store).write_text(json.dumps(content))  # as an older kvplan (no checksum) would have left it, then damaged
    with pytest.raises(KvplanInputError) as info:
        run_grid(GRID, out=out, workers=1, resume=True)
    msg = str(info.value)
    assert "0-0.json" in msg and needle in msg and "--resume recomputes its run" in msg
    assert "\n" not in msg
    assert not out.exists()
