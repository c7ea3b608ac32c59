"""The What-if page's server path (helper in15): a typed path holding a lone surrogate (a browser string may carry
one) ended in UnicodeEncodeError from os.stat, a traceback on the page; it gets the same one-line refusal as every
path that is not a file under the served directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.app import dash_serve
from kvplan.errors import KvplanInputError


@pytest.mark.parametrize("typed", ["\ud800", "t.csv\udfff", "sub/\ud83d.csv"])
def test_lone_surrogate_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, typed: str) -> None:
    (tmp_path / "t.csv").write_text("session_id,timestamp_s,input_tokens,output_tokens\na,1,10,1\n")
    monkeypatch.setenv(dash_serve.SERVE_DIR_ENV, str(tmp_path))
    with pytest.raises(KvplanInputError, match="is not a regular file under the directory this dashboard serves"):
        dash_serve.served_path(typed)
    assert dash_serve.served_path("t.csv") == str((tmp_path / "t.csv").resolve())
