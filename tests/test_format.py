import hashlib
import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tpc_hooks as tpc
from conftest import random_head, write_weights

NAMES = {"bias", "linear", "scaler.mean", "scaler.scale", "factors.2", "lambdas.2", "factors.3", "lambdas.3"}


@pytest.fixture
def saved(tmp_path):
    head = random_head(d_model=6, degree=3, ranks=(3, 2), dtype=torch.float32)
    return head, head.save_pretrained(tmp_path / "head", card=False)  # the format alone


def test_round_trip_keeps_weights_and_outputs(saved, monkeypatch):
    head, path = saved
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("loading unpickled"))
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("loading unpickled"))
    back = tpc.TPC.from_pretrained(path)
    for name, p in head.state_dict().items():
        assert torch.equal(p, back.state_dict()[name]), name
    z = torch.randn(5, 6)
    for n in (1, 2, 3):
        assert torch.equal(head(z, order=n), back(z, order=n))


def test_directory_holds_exactly_the_documented_format(saved):
    _, path = saved
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["format"] == "tpc-hooks" and cfg["format_version"] == 1
    assert (cfg["d_model"], cfg["degree"], cfg["ranks"]) == (6, 3, [3, 2])
    tensors = load_file(str(path / "model.safetensors"))
    assert set(tensors) == NAMES
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert tensors["factors.3"].shape == (6, 2) and tensors["lambdas.2"].shape == (3,)


def test_history_survives_a_round_trip(tmp_path, problem):
    Xtr, ytr, Xva, yva, _, _ = problem
    head = tpc.fit(Xtr, ytr, Xva, yva, degree=2, rank=2, epochs=3, verbose=False)
    back = tpc.TPC.from_pretrained(head.save_pretrained(tmp_path / "h"))
    assert back.history.selected == head.history.selected
    assert back.history.for_degree(2) == head.history.for_degree(2)


def _rewrite(path, edit):
    t = load_file(str(path / "model.safetensors"))
    edit(t)
    write_weights(path, t)


def test_missing_tensor(saved):
    _, path = saved
    _rewrite(path, lambda t: t.pop("lambdas.3"))
    with pytest.raises(tpc.TPCHooksError, match=r"model.safetensors lacks tensor\(s\) \['lambdas.3'\]"):
        tpc.TPC.from_pretrained(path)


def test_extra_tensor(saved):
    _, path = saved
    _rewrite(path, lambda t: t.update({"factors.4": torch.zeros(6, 2)}))
    with pytest.raises(tpc.TPCHooksError, match=r"unexpected tensor\(s\) \['factors.4'\]"):
        tpc.TPC.from_pretrained(path)


def test_wrong_shape(saved):
    _, path = saved
    _rewrite(path, lambda t: t.update({"factors.2": torch.zeros(6, 4)}))
    with pytest.raises(
        tpc.TPCHooksError, match=r"'factors.2' in model.safetensors has shape \(6, 4\) but config.json implies \(6, 3\)"
    ):
        tpc.TPC.from_pretrained(path)


def test_unknown_format_version(saved):
    _, path = saved
    cfg = json.loads((path / "config.json").read_text())
    cfg["format_version"] = 7
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        tpc.TPCHooksError,
        match="config.json has format_version=7; this version of tpc-hooks reads format_version 1 or 2",
    ):
        tpc.TPC.from_pretrained(path)


def test_truncated_weights(saved):
    _, path = saved
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        tpc.TPCHooksError, match="model.safetensors could not be read as safetensors.*truncated or corrupt"
    ):
        tpc.TPC.from_pretrained(path)


def test_corrupt_or_missing_config(saved):
    _, path = saved
    (path / "config.json").write_text('{"format": "tpc-hooks", ')
    with pytest.raises(tpc.TPCHooksError, match="config.json is not valid JSON"):
        tpc.TPC.from_pretrained(path)
    (path / "config.json").unlink()
    with pytest.raises(tpc.TPCHooksError, match="config.json is missing"):
        tpc.TPC.from_pretrained(path)


def test_config_and_weights_disagree_on_degree(saved):
    _, path = saved
    cfg = json.loads((path / "config.json").read_text())
    cfg["degree"] = 4
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(tpc.TPCHooksError, match=r"ranks=\[3, 2\] must list 3 positive integers"):
        tpc.TPC.from_pretrained(path)


def test_non_positive_scale_is_rejected(saved):
    _, path = saved
    _rewrite(path, lambda t: t["scaler.scale"].__setitem__(0, 0.0))
    with pytest.raises(tpc.TPCHooksError, match="scaler.scale must be positive"):
        tpc.TPC.from_pretrained(path)


@pytest.mark.parametrize(
    "key, value",
    [
        ("threshold", "high"),
        ("report", [1, 2]),
        ("model", "SmolLM2"),
        ("cascade", {"lower": "a", "upper": 0.9, "temperatures": [1] * 3, "biases": [0] * 3}),
    ],
)
def test_malformed_monitor_fields_name_the_file(saved, key, value):
    head, _ = saved
    path = tpc.Monitor(head, site="blocks.1.hook_resid_post").save_pretrained(saved[1].parent / "mon")
    cfg = json.loads((path / "config.json").read_text())
    cfg["monitor"][key] = value
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(tpc.TPCHooksError, match=r"mon/config\.json"):
        tpc.Monitor.from_pretrained(path)


SAVED_V1 = Path(__file__).parent / "data" / "saved-v1"


@pytest.mark.parametrize("kind", ["pooled", "token"])
def test_monitors_saved_by_format_version_1_load_and_save_unchanged(tmp_path, kind):
    """Files written before the settings became a MonitorConfig: every saved setting reads back as
    the file states it, and saving again writes the same config and the same weight bytes."""
    src = SAVED_V1 / kind
    saved = json.loads((src / "config.json").read_text())
    mon = tpc.Monitor.from_pretrained(src)
    for key in ("site", "pooling", "chat_template", "prepend_bos", "max_tokens", "threshold"):
        assert getattr(mon, key) == saved["monitor"][key]
    assert mon.model_name == saved["monitor"]["model"]["name"]
    if kind == "token":
        assert [getattr(mon, k) for k in ("aggregate", "alpha", "window", "skip")] == [
            saved["monitor"][k] for k in ("aggregate", "alpha", "window", "skip")
        ]
    else:
        assert mon.cascade.to_dict() == saved["monitor"]["cascade"]
    again = mon.save_pretrained(tmp_path / "again")
    resaved = json.loads((again / "config.json").read_text())
    checksum = resaved.pop("weights_sha256")  # what a save records now, beside the same settings
    assert resaved == saved
    assert (again / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert checksum == hashlib.sha256((src / "model.safetensors").read_bytes()).hexdigest()
