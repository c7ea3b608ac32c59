"""``simulate --verbose`` of a deployment with no calibration of its own listed the borrowed calibration's notes as if
they described the run (helper new15: a Llama-3.3-70B run on p5 read 'Assumed: TP8 on each p5en ..., the benchmark as
described (10 conversations x 5 user turns ...)'). They now say whose they are."""

from __future__ import annotations

from kvplan.models.arch import get_model
from kvplan.models.hardware import get_hardware
from kvplan.models.resolve import resolve_profile


def test_borrowed_notes_name_their_calibration() -> None:
    own, own_notes = resolve_profile(get_model("qwen3-32b"), get_hardware("p5en"), 8, None)
    assert own.status == "calibrated" and own_notes and not any(n.startswith("of the calibration") for n in own_notes)
    prof, notes = resolve_profile(get_model("llama-3.3-70b"), get_hardware("p5"), 8, None)
    assert prof.status == "composed"
    borrowed = [n for n in notes if n.startswith("of the calibration p5en-qwen3-32b (qwen3-32b on p5en TP8), whose "
                                                 "residuals this profile borrows: ")]
    assert len(borrowed) == len(own_notes)  # every one of its notes, each said whose it is
    assert notes[0].startswith("COMPOSED profile llama-3.3-70b-p5-tp8+p5en-qwen3-32b")
