"""save_pretrained / from_pretrained / push_to_hub and the generated model card (no network)."""

import re
import shutil

import huggingface_hub
import pytest
import torch

import tpc_hooks as tpc
from conftest import random_head

FILES = ["README.md", "config.json", "model.safetensors"]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SITE = "blocks.1.hook_resid_post"
PER_ORDER = [
    {"f1": 0.61234, "precision": 0.5, "recall": 0.7771, "frr": 0.1234, "auroc": 0.83456, "ece": 0.05},
    {"f1": 0.70111, "precision": 0.6, "recall": 0.8449, "frr": 0.1012, "auroc": 0.88888, "ece": 0.04},
    {"f1": 0.72349, "precision": 0.65, "recall": 0.8123, "frr": 0.0981, "auroc": 0.90404, "ece": 0.03},
]


def _head(seed=0):
    """A random degree-3 head with a gated trust region set from random rows."""
    head = random_head(d_model=6, degree=3, ranks=(2, 2), dtype=torch.float32, seed=seed)
    z = torch.randn(30, 6, generator=torch.Generator().manual_seed(seed + 100))
    return head.set_bounds(z, gate=True)


def _probe_rows():
    return torch.randn(16, 6, generator=torch.Generator().manual_seed(5)) * 3  # some rows leave the trust region


def _monitor(head, report=None):
    return tpc.Monitor(
        head=head,
        site=SITE,
        pooling="mean",
        model_name=MODEL,
        cascade=tpc.Cascade(head, tau=0.2),
        report={"validation": {"n": 10, "per_order": PER_ORDER}, "n_train": 40} if report is None else report,
    )


def _assert_same_head(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    for k in a.degrees:
        assert b.bounds(k) is not None and torch.equal(a.bounds(k), b.bounds(k))
    assert (a.gate, a.escalate_only, a.ranks) == (b.gate, b.escalate_only, b.ranks)
    z = _probe_rows()
    assert torch.equal(a.truncations(z), b.truncations(z))


def _front_matter(card):
    m = re.match(r"---\n(.*?)\n---\n", card, re.DOTALL)
    assert m, "the card must start with YAML front matter"
    return m.group(1).splitlines()


# ---------------------------------------------------------------------- heads
def test_tpc_round_trip_with_trust_region(tmp_path):
    head = _head()
    assert head.has_bounds and head.gate
    d = head.save_pretrained(tmp_path / "head")
    assert d == tmp_path / "head"
    assert sorted(p.name for p in d.iterdir()) == FILES
    _assert_same_head(head, tpc.TPC.from_pretrained(d))
    _assert_same_head(head, tpc.TPC.from_pretrained(str(d)))
    _assert_same_head(head, tpc.TPC.from_pretrained(d))  # the saved format is the plain one


def test_tpc_save_pretrained_writes_same_files_as_save(tmp_path):
    head = _head()
    head.save_pretrained(tmp_path / "a")
    head.save_pretrained(tmp_path / "b")
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    head.save_pretrained(tmp_path / "c", card=False)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == FILES[1:]


def test_tpc_card_front_matter_and_costs(tmp_path):
    head = _head()
    card = (head.save_pretrained(tmp_path) / "README.md").read_text()
    front = _front_matter(card)
    assert "library_name: tpc-hooks" in front
    assert ["- tpc-hooks", "- activation-probe", "- safety-monitor", "- interpretability"] == [
        line for line in front if line.startswith("- ")
    ]
    assert not any(line.startswith("base_model") for line in front)
    rows = re.findall(r"^\| (\d+) \| (\d+) \| (\d+) \|$", card, re.MULTILINE)
    assert [tuple(map(int, r)) for r in rows] == [(n, head.cost(n).params, head.cost(n).flops) for n in (1, 2, 3)]
    assert "| trust region | yes (gate on) |" in card
    assert "degree-3 truncated polynomial classifier" in card
    assert 'tpc.TPC.from_pretrained("' in card
    assert "not recorded" in card  # a random head has no training record
    assert not re.search(r"\d\.\d{3}", card)


def test_tpc_card_reports_history(tmp_path):
    head = _head()
    head.history = tpc.History(
        mode="progressive",
        selected={1: {"val_f1": 0.81234}, 2: {"val_f1": 0.84567}},
        config=tpc.FitConfig(degree=3, rank=2, recipe="paper", seed=7),
    )
    card = head.model_card()
    assert re.search(r"^\| 1 \| 0\.812 \|$", card, re.MULTILINE) and re.search(
        r"^\| 2 \| 0\.846 \|$", card, re.MULTILINE
    )
    assert re.search(r"^\| 3 \| not recorded \|$", card, re.MULTILINE)
    assert "recipe='paper'" in card and "seed=7" in card
    loaded = tpc.TPC.from_pretrained(head.save_pretrained(tmp_path))  # the history travels in config.json
    assert loaded.history.selected[1]["val_f1"] == 0.81234


# ---------------------------------------------------------------------- monitors
def test_monitor_round_trip_and_card(tmp_path):
    head = _head()
    mon = _monitor(head)
    d = mon.save_pretrained(tmp_path / "mon")
    assert sorted(p.name for p in d.iterdir()) == FILES
    back = tpc.Monitor.from_pretrained(d)
    assert (back.site, back.pooling, back.threshold, back.model_name) == (SITE, "mean", mon.threshold, MODEL)
    assert (back.cascade.lower, back.cascade.upper) == (mon.cascade.lower, mon.cascade.upper) == (0.2, 0.8)
    assert back.report == mon.report
    _assert_same_head(head, back.head)
    z = _probe_rows()
    a, b = mon.policy()(z), back.policy()(z)
    assert torch.equal(a.probs, b.probs) and torch.equal(a.exit_order, b.exit_order)

    card = (d / "README.md").read_text()
    assert f"base_model: {MODEL}" in _front_matter(card)
    assert SITE in card and "| pooling | `mean` |" in card
    assert "exit benign at p <= 0.2, harmful at p >= 0.8" in card
    for n, m in enumerate(PER_ORDER, start=1):
        row = f"| {n} | {m['f1']:.3f} | {m['recall']:.3f} | {m['frr']:.3f} | {m['auroc']:.3f} |"
        assert row in card
    assert "Training prompts: 40; validation prompts: 10." in card
    assert 'monitor = tpc.Monitor.from_pretrained("' in card and 'action="stop"' in card


def test_monitor_card_without_report_invents_nothing():
    mon = tpc.Monitor(head=_head(), site=SITE, report={})
    card = mon.model_card()
    section = card.split("## Training data and metrics")[1].split("## How to load")[0]
    assert "Validation metrics: not recorded." in section and "Data: not recorded." in section
    assert "Training prompts: not recorded; validation prompts: not recorded." in section
    assert not re.search(r"\d\.\d{3}", card)
    assert "| model | not recorded |" in card
    assert not any(line.startswith("base_model") for line in _front_matter(card))


def test_card_escapes_model_name_and_shows_data():
    head = _head()
    mon = tpc.Monitor(
        head=head,
        site=SITE,
        model_name="local|model\nname",
        report={"data": "prompts | from <b>somewhere</b>", "validation": {"per_order": [{"f1": 0.5}]}},
    )
    card = mon.model_card()
    assert "base_model" not in card  # not a hub id
    assert "| model | `local\\|model name` |" in card
    assert "prompts \\| from &lt;b&gt;somewhere&lt;/b&gt;" in card
    assert "| 1 | 0.500 | not recorded | not recorded | not recorded |" in card
    settings = card.split("## The monitor")[1].split("## The head")[0]
    rows = [line for line in settings.splitlines() if line.startswith("|")]
    assert len(rows) == 10 and all(len(re.split(r"(?<!\\)\|", line)) == 4 for line in rows)  # two cells each


# ---------------------------------------------------------------------- the hub, faked
def test_push_to_hub_uploads_the_saved_files(tmp_path, monkeypatch):
    head = _head()
    calls = {}

    def create_repo(self, repo_id, **kw):
        calls["create"] = (repo_id, kw)
        return "url"

    def upload_folder(self, **kw):
        from pathlib import Path

        folder = Path(kw["folder_path"])
        calls["upload"] = kw
        calls["files"] = {p.name: p.read_bytes() for p in folder.iterdir()}
        return "commit-info"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    out = head.push_to_hub("someone/tiny-head", private=True, commit_message="hello", revision="dev")
    assert out == "commit-info"
    assert calls["create"] == ("someone/tiny-head", {"private": True, "exist_ok": True, "repo_type": "model"})
    up = calls["upload"]
    assert (up["repo_id"], up["commit_message"], up["revision"], up["repo_type"]) == (
        "someone/tiny-head",
        "hello",
        "dev",
        "model",
    )
    assert sorted(calls["files"]) == FILES
    ref = head.save_pretrained(tmp_path / "ref")
    for name in ("config.json", "model.safetensors"):
        assert calls["files"][name] == (ref / name).read_bytes()
    assert b'tpc.TPC.from_pretrained("someone/tiny-head")' in calls["files"]["README.md"]

    calls.clear()
    _monitor(head).push_to_hub("someone/tiny-monitor")
    assert calls["create"][1]["private"] is None and sorted(calls["files"]) == FILES
    with pytest.raises(tpc.TPCHooksError, match="hub model id"):
        head.push_to_hub("not/a/repo")


def test_from_pretrained_repo_id_downloads_and_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "someone/tiny-head" must not exist locally
    head = _head()
    saved = head.save_pretrained(tmp_path / "snapshot")
    calls = []

    def snapshot_download(**kw):
        calls.append(kw)
        return str(saved)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    loaded = tpc.TPC.from_pretrained("someone/tiny-head", revision="v1", cache_dir=str(tmp_path / "cache"))
    _assert_same_head(head, loaded)
    (kw,) = calls
    assert kw["repo_id"] == "someone/tiny-head" and kw["revision"] == "v1" and kw["token"] is None
    assert kw["cache_dir"] == str(tmp_path / "cache")
    assert sorted(kw["allow_patterns"]) == FILES

    mon_dir = _monitor(head).save_pretrained(tmp_path / "mon-snapshot")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda **kw: str(mon_dir))
    assert tpc.Monitor.from_pretrained("someone/tiny-monitor").site == SITE


def test_from_pretrained_download_failure_explains(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def offline(**kw):
        raise huggingface_hub.errors.LocalEntryNotFoundError("x")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(tpc.TPCHooksError) as err:
        tpc.Monitor.from_pretrained("someone/unreachable")
    msg = str(err.value)
    assert "'someone/unreachable'" in msg and "not a local directory" in msg
    assert "save_pretrained" in msg and "local directory" in msg and "could not be reached" in msg


def test_from_pretrained_missing_local_path(tmp_path, monkeypatch):
    def never(**kw):
        raise AssertionError("a local path must not be downloaded")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", never)
    missing = tmp_path / "nope" / "deeper"
    for arg in (str(missing), missing, "./missing/dir/x"):
        with pytest.raises(tpc.TPCHooksError, match="does not exist"):
            tpc.TPC.from_pretrained(arg)
    _head().save_pretrained(tmp_path / "d")
    with pytest.raises(tpc.TPCHooksError, match="is a file"):
        tpc.TPC.from_pretrained(tmp_path / "d" / "config.json")


def test_from_pretrained_corrupt_directory(tmp_path):
    d = _head().save_pretrained(tmp_path / "head")
    (d / "model.safetensors").unlink()
    with pytest.raises(tpc.TPCHooksError, match="model.safetensors"):
        tpc.TPC.from_pretrained(d)
    shutil.rmtree(d)
    with pytest.raises(tpc.TPCHooksError, match="does not exist"):
        tpc.TPC.from_pretrained(d)


def test_save_and_load_are_deprecated_aliases_that_warn_once(tmp_path, monkeypatch):
    """``save`` writes what ``save_pretrained(card=False)`` writes, ``load`` reads what
    ``from_pretrained`` reads; each warns once per process (a FutureWarning naming the new name)."""
    from tpc_hooks import _errors

    monkeypatch.setattr(_errors, "_WARNED", set())
    head = _head()
    mon = tpc.Monitor(head, SITE, threshold=0.3)
    with pytest.warns(FutureWarning, match=r"TPC\.save is deprecated; use TPC\.save_pretrained"):
        old = head.save(tmp_path / "old")
    new = head.save_pretrained(tmp_path / "new", card=False)
    assert sorted(p.name for p in old.iterdir()) == sorted(p.name for p in new.iterdir())
    assert all((old / f).read_bytes() == (new / f).read_bytes() for f in ("config.json", "model.safetensors"))
    with pytest.warns(FutureWarning, match=r"Monitor\.save is deprecated"):
        mon.save(tmp_path / "mon")
    with pytest.warns(FutureWarning, match=r"Monitor\.load is deprecated; use Monitor\.from_pretrained"):
        back = tpc.Monitor.load(tmp_path / "mon")
    assert back.threshold == 0.3 and back.site == SITE
    with pytest.warns(FutureWarning, match=r"TPC\.load is deprecated"):
        _assert_same_head(head, tpc.TPC.load(old))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second use is silent
        head.save(tmp_path / "again")
        tpc.TPC.load(old)
