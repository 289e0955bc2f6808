"""Bad paths and bad files at the CLI's edges: one line on stderr, exit 2, no traceback, no model loaded.

Every case fails on its input checks before a model could load: the model loaders, the demo,
the hub dataset loader and socket connections are replaced by functions that fail the test.
"""

import json
import socket

import pytest

import tpc_hooks as tpc
from tpc_hooks import data, offline
from tpc_hooks.cli import _data as _cli_data
from tpc_hooks.cli import _models as cli_models
from tpc_hooks.cli import _verbs as cli
from tpc_hooks.cli import main

SITE = "blocks.0.hook_resid_post"


def _boom(what):
    def fail(*args, **kwargs):
        raise AssertionError(what)

    return fail


@pytest.fixture(autouse=True)
def no_model_no_network(monkeypatch):
    from tpc_hooks.cli import _demo as demo

    monkeypatch.setattr(offline, "load_model", _boom("model loaded"))
    monkeypatch.setattr(offline, "load_hf", _boom("model loaded"))
    monkeypatch.setattr(demo, "run_demo", _boom("demo started"))
    monkeypatch.setattr(data, "load_hf_dataset", _boom("hub dataset loaded"))
    monkeypatch.setattr(cli_models, "load_model", _boom("model loaded"))  # the CLI's own references
    monkeypatch.setattr(cli, "run_demo", _boom("demo started"))
    monkeypatch.setattr(_cli_data, "load_hf_dataset", _boom("hub dataset loaded"))
    monkeypatch.setattr(socket.socket, "connect", _boom("network touched"))


def _acts(root, *, cfg=True, splits=("all",), labels="[0, 1]", sites=(SITE,)):
    """A collect directory without real activations (the checks run before any are read)."""
    root.mkdir()
    if cfg:
        (root / "collect.json").write_text(
            json.dumps(
                {
                    "model": None,
                    "toolkit": "transformer_lens",
                    "sites": list(sites),
                    "pooling": "mean",
                    "chat_template": True,
                    "max_tokens": 512,
                    "dataset": "default",
                    "splits": {s: 2 for s in splits},
                }
            )
        )
    for s in splits:
        (root / s / sites[0]).mkdir(parents=True)
        (root / s / "labels.json").write_text(labels)
    return root


def _monitor(root):
    tpc.Monitor(tpc.TPC(4, 2, 2), SITE).save_pretrained(root)
    return root


def _case(name):
    """(argv, the bad path or name the message must contain) for a case, built under ``tmp``."""

    def train_missing_acts(tmp):
        return ["train", "--acts", str(tmp / "missing"), "--out", str(tmp / "m")], str(tmp / "missing")

    def train_acts_is_a_file(tmp):
        (tmp / "acts").write_text("x")
        return ["train", "--acts", str(tmp / "acts"), "--out", str(tmp / "m")], str(tmp / "acts")

    def train_no_collect_json(tmp):
        acts = _acts(tmp / "acts", cfg=False)
        return ["train", "--acts", str(acts), "--out", str(tmp / "m")], str(acts)

    def train_corrupt_collect_json(tmp):
        acts = _acts(tmp / "acts")
        (acts / "collect.json").write_text("{not json")
        return ["train", "--acts", str(acts), "--out", str(tmp / "m")], str(acts / "collect.json")

    def train_collect_json_lacks_keys(tmp):
        acts = _acts(tmp / "acts")
        (acts / "collect.json").write_text('{"sites": ["x"]}')
        return ["train", "--acts", str(acts), "--out", str(tmp / "m")], str(acts / "collect.json")

    def train_site_not_collected(tmp):
        acts = _acts(tmp / "acts")
        return [
            "train",
            "--acts",
            str(acts),
            "--out",
            str(tmp / "m"),
            "--site",
            "blocks.99.hook_resid_post",
        ], "blocks.99.hook_resid_post"

    def train_corrupt_labels(tmp):
        acts = _acts(tmp / "acts", labels="[0, 1")
        return ["train", "--acts", str(acts), "--out", str(tmp / "m")], str(acts / "all" / "labels.json")

    def train_labels_not_binary(tmp):
        acts = _acts(tmp / "acts", labels='["yes", "no"]')
        return ["train", "--acts", str(acts), "--out", str(tmp / "m")], str(acts / "all" / "labels.json")

    def train_no_split(tmp):
        acts = _acts(tmp / "acts", splits=())
        return ["train", "--acts", str(acts), "--out", str(tmp / "m")], str(acts / "all")

    def train_out_is_a_file(tmp):
        acts = _acts(tmp / "acts")
        (tmp / "m").write_text("x")
        return ["train", "--acts", str(acts), "--out", str(tmp / "m")], str(tmp / "m")

    def evaluate_missing_monitor(tmp):
        acts = _acts(tmp / "acts")
        return ["evaluate", "--monitor", str(tmp / "nomon"), "--acts", str(acts)], str(tmp / "nomon")

    def evaluate_corrupt_monitor(tmp):
        mon = _monitor(tmp / "mon")
        (mon / "config.json").write_text("\x00garbage{")
        return ["evaluate", "--monitor", str(mon), "--acts", str(_acts(tmp / "acts"))], str(mon / "config.json")

    def evaluate_monitor_config_malformed(tmp):
        mon = _monitor(tmp / "mon")
        cfg = json.loads((mon / "config.json").read_text())
        cfg["monitor"]["model"] = "not an object"
        (mon / "config.json").write_text(json.dumps(cfg))
        return ["evaluate", "--monitor", str(mon), "--acts", str(_acts(tmp / "acts"))], str(mon)

    def evaluate_monitor_config_without_weights(tmp):
        (tmp / "mon").mkdir()
        (tmp / "mon" / "config.json").write_text("garbage")
        return ["evaluate", "--monitor", str(tmp / "mon"), "--acts", str(_acts(tmp / "acts"))], str(tmp / "mon")

    def evaluate_missing_acts(tmp):
        mon = _monitor(tmp / "mon")
        return ["evaluate", "--monitor", str(mon), "--acts", str(tmp / "noacts")], str(tmp / "noacts")

    def evaluate_missing_split(tmp):
        mon, acts = _monitor(tmp / "mon"), _acts(tmp / "acts")
        return ["evaluate", "--monitor", str(mon), "--acts", str(acts), "--splits", "test"], str(acts / "test")

    def evaluate_site_not_collected(tmp):
        mon, acts = _monitor(tmp / "mon"), _acts(tmp / "acts", sites=("blocks.3.hook_resid_post",))
        return ["evaluate", "--monitor", str(mon), "--acts", str(acts), "--splits", "all"], str(acts / "all")

    def evaluate_json_into_missing_dir(tmp):
        mon, acts = _monitor(tmp / "mon"), _acts(tmp / "acts")
        bad = tmp / "nodir" / "e.json"
        return ["evaluate", "--monitor", str(mon), "--acts", str(acts), "--splits", "all", "--json", str(bad)], str(bad)

    def monitor_missing_monitor(tmp):
        return ["monitor", "--monitor", str(tmp / "nomon"), "--prompt", "hi"], str(tmp / "nomon")

    def monitor_missing_local_model(tmp):
        mon = _monitor(tmp / "mon")
        bad = str(tmp / "models" / "mine")
        return ["monitor", "--monitor", str(mon), "--prompt", "hi", "--model", bad], bad

    def attribute_missing_monitor(tmp):
        return ["attribute", "--monitor", str(tmp / "nomon"), "--prompt", "hi"], str(tmp / "nomon")

    def attribute_monitor_is_a_file(tmp):
        (tmp / "mon").write_text("x")
        return ["attribute", "--monitor", str(tmp / "mon"), "--prompt", "hi"], str(tmp / "mon")

    def attribute_json_into_missing_dir(tmp):
        mon = _monitor(tmp / "mon")
        bad = tmp / "nodir" / "a.json"
        return ["attribute", "--monitor", str(mon), "--prompt", "hi", "--json", str(bad)], str(bad)

    def collect_missing_dataset_file(tmp):
        return ["collect", "--dataset", "./nope/prompts.csv", "--out", str(tmp / "acts")], "./nope/prompts.csv"

    def collect_missing_dataset_without_separator(tmp):
        return ["collect", "--dataset", "prompts.jsonl", "--out", str(tmp / "acts")], "prompts.jsonl"

    def collect_dataset_not_utf8(tmp):
        (tmp / "p.csv").write_bytes(b"text,label\n\xff\xfe\xfa,1\n")
        return ["collect", "--dataset", str(tmp / "p.csv"), "--out", str(tmp / "acts")], str(tmp / "p.csv")

    def collect_dataset_bad_suffix(tmp):
        (tmp / "p.txt").write_text("hello")
        return ["collect", "--dataset", str(tmp / "p.txt"), "--out", str(tmp / "acts")], str(tmp / "p.txt")

    def collect_out_is_a_file(tmp):
        (tmp / "acts").write_text("x")
        return ["collect", "--out", str(tmp / "acts")], str(tmp / "acts")

    def collect_model_is_a_file(tmp):
        (tmp / "model.gguf").write_text("x")
        return ["collect", "--out", str(tmp / "acts"), "--model", str(tmp / "model.gguf")], str(tmp / "model.gguf")

    def demo_out_is_a_file(tmp):
        (tmp / "run").write_text("x")
        return ["demo", "--quick", "--out", str(tmp / "run")], str(tmp / "run")

    def demo_missing_dataset_file(tmp):
        bad = str(tmp / "nope" / "prompts.jsonl")
        return ["demo", "--quick", "--dataset", bad, "--out", str(tmp / "run")], bad

    def demo_missing_local_model(tmp):
        return ["demo", "--quick", "--model", "./no/such/model", "--out", str(tmp / "run")], "./no/such/model"

    return locals()[name]


CASES = [
    "train_missing_acts",
    "train_acts_is_a_file",
    "train_no_collect_json",
    "train_corrupt_collect_json",
    "train_collect_json_lacks_keys",
    "train_site_not_collected",
    "train_corrupt_labels",
    "train_labels_not_binary",
    "train_no_split",
    "train_out_is_a_file",
    "evaluate_missing_monitor",
    "evaluate_corrupt_monitor",
    "evaluate_monitor_config_malformed",
    "evaluate_monitor_config_without_weights",
    "evaluate_missing_acts",
    "evaluate_missing_split",
    "evaluate_site_not_collected",
    "evaluate_json_into_missing_dir",
    "monitor_missing_monitor",
    "monitor_missing_local_model",
    "attribute_missing_monitor",
    "attribute_monitor_is_a_file",
    "attribute_json_into_missing_dir",
    "collect_missing_dataset_file",
    "collect_missing_dataset_without_separator",
    "collect_dataset_not_utf8",
    "collect_dataset_bad_suffix",
    "collect_out_is_a_file",
    "collect_model_is_a_file",
    "demo_out_is_a_file",
    "demo_missing_dataset_file",
    "demo_missing_local_model",
]


@pytest.mark.parametrize("case", CASES)
def test_a_bad_path_is_one_line_and_exit_2(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, bad = _case(case)(tmp_path)
    capsys.readouterr()
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), captured.err
    verb = argv[0]
    assert lines[0].startswith(f"tpc-hooks {verb}: "), lines[0]
    assert bad in lines[0], (bad, lines[0])
    assert "Traceback" not in captured.err + captured.out
    assert not (tmp_path / "m" / "config.json").exists()  # train wrote no monitor


def test_every_verb_is_covered():
    assert {c.split("_")[0] for c in CASES} == {"demo", "collect", "train", "evaluate", "monitor", "attribute"}


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--out", "x"],
        ["evaluate", "--acts", "x"],
        ["monitor", "--monitor", "x"],
        ["attribute", "--k", "3"],  # no --prompt (without --monitor: the pretrained monitor)
        ["collect"],
        ["demo", "--layer", "deep"],
    ],
)
def test_usage_errors_stay_argparse_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tpc-hooks") and "Traceback" not in err


@pytest.mark.parametrize(
    "exc, text",
    [
        (FileNotFoundError(2, "No such file or directory", "/x/y.json"), "/x/y.json does not exist"),
        (PermissionError(13, "Permission denied", "/root/z"), "/root/z is not accessible"),
        (IsADirectoryError(21, "Is a directory", "/tmp"), "/tmp is a directory where a file was expected"),
        (NotADirectoryError(20, "Not a directory", "/f/g"), "/f/g is (under) a file"),
        (json.JSONDecodeError("Expecting value", "{", 1), "is not valid JSON"),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "is not UTF-8 text"),
    ],
)
def test_the_safety_net_makes_stray_file_errors_one_line(exc, text, tmp_path, capsys, monkeypatch):
    def raise_it(args):
        raise exc

    monkeypatch.setattr(cli, "check_acts", raise_it)
    assert main(["train", "--acts", str(tmp_path), "--out", str(tmp_path / "m")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tpc-hooks train: ") and text in lines[0], lines


def test_a_multiline_message_is_joined_into_one_line(tmp_path, capsys, monkeypatch):
    def raise_it(args):
        raise tpc.TPCHooksError("first line\n  second line\n")

    monkeypatch.setattr(cli, "check_acts", raise_it)
    assert main(["train", "--acts", str(tmp_path), "--out", str(tmp_path / "m")]) == 2
    assert capsys.readouterr().err == "tpc-hooks train: first line second line\n"


def test_a_hub_id_is_not_taken_for_a_missing_file(tmp_path, monkeypatch):
    """ "org/name" is passed on to the hub loader (here a stand-in that fails the test on purpose)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AssertionError, match="hub dataset loaded"):
        main(["collect", "--dataset", "allenai/wildguardmix", "--out", str(tmp_path / "acts")])
