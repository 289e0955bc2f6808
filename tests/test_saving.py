"""Saving is whole or not at all: a crash between any two writes leaves the previous save or the
new one, the user's own files in the directory are left alone, and corrupted-but-finite weights
are refused by their checksum."""

import json
import os
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_head

import tpc_hooks as tpc

SITE = "blocks.1.hook_resid_post"


class Crash(Exception):
    pass


def _monitor(seed, threshold):
    head = tiny_head(seed=seed)
    return tpc.Monitor(head, SITE, cascade=tpc.Cascade(head, 0.1), threshold=threshold)


def _same(a, b):
    z = torch.randn(7, 32, generator=torch.Generator().manual_seed(3))
    return a.threshold == b.threshold and torch.equal(a.policy()(z).logits, b.policy()(z).logits)


def _crash_after(monkeypatch, n):
    """Every write, rename, link and delete the save makes counts; the n-th raises before it happens."""
    calls = {"n": 0}

    def counted(real):
        def f(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == n:
                raise Crash(f"crash at write {n}")
            return real(*args, **kwargs)

        return f

    monkeypatch.setattr(os, "replace", counted(os.replace))
    monkeypatch.setattr(os, "link", counted(os.link))
    for name in ("unlink", "write_bytes", "write_text"):
        monkeypatch.setattr(Path, name, counted(getattr(Path, name)))
    return calls


def test_a_crash_between_any_two_writes_leaves_the_old_or_the_new_monitor(tmp_path, monkeypatch):
    old, new = _monitor(0, 0.3), _monitor(1, 0.7)
    outcomes = []
    for n in range(1, 50):
        d = tmp_path / f"m{n}"
        old.save_pretrained(d)
        with monkeypatch.context() as m:
            calls = _crash_after(m, n)
            try:
                new.save_pretrained(d)
                crashed = False
            except Crash:
                crashed = True
        loaded = tpc.Monitor.from_pretrained(d)
        outcomes.append("new" if _same(loaded, new) else "old" if _same(loaded, old) else "mix")
        if not crashed:
            break
    assert "mix" not in outcomes and outcomes[0] == "old" and outcomes[-1] == "new"
    assert n == calls["n"] + 1 > 4  # every write was a crash point once
    assert not list(d.glob(".*"))  # a complete save leaves no temporary or previous file behind


def test_corrupted_but_finite_weights_are_refused_by_their_checksum(tmp_path):
    d = _monitor(0, 0.3).save_pretrained(tmp_path / "m")
    data = bytearray((d / "model.safetensors").read_bytes())
    data[-4:] = torch.tensor([1.5]).numpy().tobytes()  # the last float32 of the last tensor: still finite
    (d / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(tpc.TPCHooksError, match="does not match the SHA-256 recorded in"):
        tpc.Monitor.from_pretrained(d)


def test_the_users_readme_is_left_alone_unless_asked(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "README.md").write_text("# my notes\n")
    (d / "notes.txt").write_text("mine")
    mon = _monitor(0, 0.3)
    with pytest.raises(
        tpc.TPCHooksError,
        match=r"README.md exists and is not a tpc-hooks model card; it is left alone: "
        r"pass card=False .* or card='overwrite'",
    ):
        mon.save_pretrained(d)
    assert sorted(p.name for p in d.iterdir()) == ["README.md", "notes.txt"]  # nothing was written
    mon.save_pretrained(d, card=False)
    assert (d / "README.md").read_text() == "# my notes\n" and (d / "notes.txt").read_text() == "mine"
    mon.save_pretrained(d, card="overwrite")
    assert (d / "README.md").read_text().startswith("---\nlibrary_name: tpc-hooks\n")
    _monitor(1, 0.7).save_pretrained(d)  # our own card is ours to replace
    assert "0.7" in (d / "README.md").read_text() and (d / "notes.txt").read_text() == "mine"


def test_a_file_where_the_directory_goes_is_a_clear_error(tmp_path):
    (tmp_path / "m").write_text("x")
    with pytest.raises(tpc.TPCHooksError, match="is a file, not a directory"):
        _monitor(0, 0.3).save_pretrained(tmp_path / "m")


def test_the_config_records_the_weights_checksum(tmp_path):
    import hashlib

    d = _monitor(0, 0.3).save_pretrained(tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["weights_sha256"] == hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
