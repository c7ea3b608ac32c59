"""A sweep too short for the screen's steady comparison says how many conversations would do (helper new15: it said
'raise workload.conversations', no number)."""

from __future__ import annotations

import math

import pandas as pd
from conftest import small

from kvplan.app.cmd_sweep import raise_conversations_text, steady_sweep_conversations
from kvplan.plan.grid import grid_from_dict


def test_count_puts_the_window_after_the_ramp_up() -> None:
    g = grid_from_dict({"base": small(), "axes": {"policy.decoder_kv_blocks_ttl_s": [30, 120]}})
    assert g.base.workload.conversations == 60
    rows = pd.DataFrame([  # point 1 (TTL 120 s) needs 60 x 2 (120 + 150) / 200 = 162 conversations
        {"point": 0, "error": None, "arrival_span_s": 200.0, "conversation_span_p90_s": 100.0, "conversations": 60},
        {"point": 1, "error": None, "arrival_span_s": 200.0, "conversation_span_p90_s": 150.0, "conversations": 60},
        {"point": 1, "error": "boom", "arrival_span_s": 1.0, "conversation_span_p90_s": 1e6, "conversations": 60}])
    assert steady_sweep_conversations(g, rows, [0, 1]) == (60, math.ceil(60 * 2 * 270 / 200))
    assert raise_conversations_text(g, rows, [1]).startswith("raise workload.conversations to at least 162 (from 60;")
    off = grid_from_dict({"base": small(policy={"bidirectional": False}),
                          "axes": {"policy.kv_recompute_threshold_tokens": [64]}})
    # retention off: only P's window matters, one span: 60 x 2 x 100 / 200 = 60, no more than asked
    assert raise_conversations_text(off, rows.iloc[:1], [0]) == "raise workload.conversations"
