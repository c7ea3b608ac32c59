"""A profile file is the whole cost model: a component it leaves out would load as zero costs (free prefill, free
transfers) under the profile's own status, and an unknown status would pass as whatever a reader assumes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.app.cli import main
from kvplan.models.profile import PROFILE_COMPONENTS, _profiles_dir


@pytest.mark.parametrize("comp", PROFILE_COMPONENTS)
@pytest.mark.parametrize("how", ["missing", "empty"])
def test_a_profile_without_a_cost_component_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        comp: str, how: str) -> None:
    data = json.loads((_profiles_dir() / "p5en-qwen3-32b.json").read_text())
    if how == "missing":
        del data["costs"][comp]
    else:
        data["costs"][comp] = {}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    assert main(["cost", "--profile", str(path), "--tokens", "8000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"field 'costs.{comp}'" in err[0] and "zero costs" in err[0]


def test_an_unknown_status_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads((_profiles_dir() / "p5en-qwen3-32b.json").read_text())
    data["status"] = "trust-me"
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    assert main(["cost", "--profile", str(path), "--tokens", "8000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "status" in err[0]
    data["status"] = "calibrated"
    path.write_text(json.dumps(data))
    assert main(["cost", "--profile", str(path), "--tokens", "8000"]) == 0  # the shipped profile itself loads


@pytest.mark.parametrize(("args", "field"), [
    (["--tokens", "100000"], "--tokens"),  # Qwen3-32B serves 40,960 tokens
    (["--tokens", "30000", "--cached-tokens", "30000"], "--cached-tokens + --tokens"),
    (["--tokens", "100", "--context", "50000"], "--context"),
    (["--tokens", "100", "--batch", "1000", "--context", "40000"], "--batch"),  # 40M tokens of KV vs a 3.7M pool
])
def test_cost_refuses_what_no_server_serves(capsys: pytest.CaptureFixture[str], args: list[str], field: str) -> None:
    assert main(["cost", "--model", "qwen3-32b", "--hardware", "p5en", "--tp", "8", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}: ")


@pytest.mark.parametrize(("text", "kind"), [("[]", "an array"), ('"p5en"', "a string"), ("3", "a number"),
                                            ("null", "null")])
def test_a_profile_file_that_is_not_an_object_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str,
                                                      kind: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    assert main(["cost", "--profile", str(path), "--tokens", "8000"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {path}: is {kind}, not a profile (a JSON object); pass a profile written by kvplan "
                   "calibrate or kvplan profile derive\n")


def test_a_wrongly_typed_profile_field_says_how_to_fix_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads((_profiles_dir() / "p5en-qwen3-32b.json").read_text())
    data["name"] = 5
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    assert main(["cost", "--profile", str(path), "--tokens", "8000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: field 'name': ") and err.endswith("; re-create the profile with kvplan "
                                                                            "calibrate or kvplan profile derive\n")


@pytest.mark.parametrize(("comp", "key", "value", "shown"), [
    ("prefill", "attention_s", True, "True"),
    ("prefill", "attention_s", "2.6e-10", "'2.6e-10'"),
    ("decode", "overhead_s", False, "False"),
])
def test_a_cost_parameter_that_is_not_a_number_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          comp: str, key: str, value: object, shown: str) -> None:
    """A hand-edited profile with ``"attention_s": true`` was read as 1.0 s per attention pair (kvplan cost printed a
    5,050 s prefill), and ``"2.6e-10"`` as the number: pydantic's lax mode. A cost parameter is a number."""
    data = json.loads((_profiles_dir() / "p5en-qwen3-32b.json").read_text())
    data["costs"][comp][key] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    assert main(["cost", "--profile", str(path), "--tokens", "8000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: field 'costs.{comp}.{key}': is {shown}, not a number; write a plain number")
    assert err.count("\n") == 1


def test_a_knot_list_item_that_is_not_a_number_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads((_profiles_dir() / "p5en-qwen3-32b.json").read_text())
    knots = list(data["costs"]["prefill"]["linear_knots_s"])
    assert knots, "the shipped profile has prefill knots"
    knots[0] = str(knots[0])
    data["costs"]["prefill"]["linear_knots_s"] = knots
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    assert main(["cost", "--profile", str(path), "--tokens", "8000"]) == 2
    assert "field 'costs.prefill.linear_knots_s': is '" in capsys.readouterr().err


@pytest.mark.parametrize(("value", "shown"), [(True, "True"), ("8", "'8'")])
def test_a_profile_tp_that_is_not_an_integer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        value: object, shown: str) -> None:
    """``"tensor_parallel_size": true`` was read as TP 1, and the error then blamed prefill.attention_s's physical bound
    at TP1; ``"8"`` was read as 8."""
    data = json.loads((_profiles_dir() / "p5en-qwen3-32b.json").read_text())
    data["tensor_parallel_size"] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    assert main(["cost", "--profile", str(path), "--tokens", "8000"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {path}: field 'tensor_parallel_size': is {shown}, not an integer")


def test_the_priors_index_is_not_a_profile_name(capsys: pytest.CaptureFixture[str]) -> None:
    """``--profile INDEX`` loaded models/priors/INDEX.json (the priors' index, which shipped_priors leaves out) and
    failed on it as a broken profile ("field 'name': Field required; re-create the profile ...")."""
    assert main(["cost", "--profile", "INDEX", "--tokens", "8000"]) == 2
    assert capsys.readouterr().err.startswith("error: profile: no profile named or at 'INDEX'; use a path or one of")
    assert main(["cost", "--profile", "qwen3-32b-h200-tp8", "--hardware", "p5en", "--tokens", "8000"]) == 0
