"""A hand-edited profile JSON (or --model-config config.json) with a key given twice (helper in15): JSON keeps the
last silently, so a profile whose 'name' (or a cost parameter) was pasted twice ran with whichever came last; a YAML
scenario already refuses a key given twice. Refused in one line naming the key; the shipped profiles still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostile import run_limited

from kvplan.errors import KvplanInputError
from kvplan.inputfile import json_loads
from kvplan.models.profile import load_profile

SHIPPED = Path(__file__).resolve().parent.parent / "models" / "profiles" / "p5en-qwen3-32b.json"


def test_profile_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    text = SHIPPED.read_text()
    data = json.loads(text)
    body = json.dumps(data, indent=1)
    twice = body.replace('"name": ', f'"name": {json.dumps(data["name"] + "-old")},\n "name": ', 1)
    assert twice != body
    (tmp_path / "p.json").write_text(twice)
    res = run_limited(["cost", "--profile", str(tmp_path / "p.json"), "--tokens", "100"], tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2 and len(lines) == 1, res.stderr[-500:]
    assert "p.json: key 'name' given twice in one JSON object; keep one" in lines[0]


def test_model_config_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(
        '{"architectures": ["X"], "num_hidden_layers": 4, "num_hidden_layers": 40, "hidden_size": 512, '
        '"num_attention_heads": 8}')
    res = run_limited(["profile", "derive", "--model", "mine", "--gpu", "h200", "--tp", "8", "--out",
                       str(tmp_path / "o.json"), "--model-config", str(tmp_path / "cfg")], tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2 and len(lines) == 1, res.stderr[-500:]
    assert "key 'num_hidden_layers' given twice" in lines[0]


def test_shipped_profile_and_unique_keys_still_load() -> None:
    assert load_profile(str(SHIPPED)).name
    assert json_loads('{"a": {"b": 1}, "c": [{"b": 2}]}', "x", unique_keys=True)[0] == {"a": {"b": 1}, "c": [{"b": 2}]}
    assert json_loads('{"a": 1, "a": 2}', "x")[0] == {"a": 2}  # default: traces keep JSON's rule (speed)
    with pytest.raises(KvplanInputError, match="key 'a' given twice"):
        json_loads('{"z": {"a": 1, "a": 2}}', "x", unique_keys=True)
