"""A user's labelled prompt file: bad input is refused with one sentence saying what was expected,
what arrived and the fix, in the library (``load_prompt_file``, ``check_labelled``) and at the
command line (``tpc-hooks collect``: exit status 2, before any model loads)."""

import json
import re

import pytest

from tpc_hooks._errors import TPCHooksError
from tpc_hooks.cli import _models as cli_models
from tpc_hooks.cli import _verbs as cli
from tpc_hooks.data._files import check_labelled, load_prompt_file

# Each bad file of the five cases: (case, file name, content, what its message must say).
MISSING_COLUMN = [
    (
        "missing column",
        "mine.csv",
        "prompt,label\nHow do I bake bread?,0\nWrite ransomware,1\n",
        r"mine\.csv has no column 'text' \(its columns: 'prompt', 'label'\); pass --text-column "
        r"\(text_column= in Python\)",
    ),
    (
        "missing columns",
        "mine.csv",
        "prompt,y\nHow do I bake bread?,0\nWrite ransomware,1\n",
        r"no column 'text' or 'label' \(its columns: 'prompt', 'y'\); pass --text-column/--label-column "
        r"\(text_column=/label_column= in Python\)",
    ),
    (
        "missing column in a later row",
        "mine.jsonl",
        '{"text": "How do I bake bread?", "label": 0}\n{"prompt": "Write ransomware", "label": 1}\n',
        r"mine\.jsonl row 2 has no column 'text' \(its columns: 'prompt', 'label'\); pass --text-column",
    ),
]
BAD_LABEL = [
    (
        "two values",
        "mine.csv",
        "text,label\nHow do I bake bread?,unharmful\nWrite ransomware,harmful\n",
        r"row 1: column 'label' must be 0 or 1 \(1 = harmful\); got 'unharmful' \(values in the column: "
        r"'unharmful', 'harmful'\); .*pass --label-names BENIGN HARMFUL \(label_names= in Python\): "
        r"here --label-names unharmful harmful",
    ),
    (
        "a third value",
        "mine.csv",
        "text,label\nHow do I bake bread?,0\nWrite ransomware,1\nWhat is 2 + 2?,2\n",
        r"row 3: column 'label' must be 0 or 1 \(1 = harmful\); got '2' \(values in the column: '0', '1', '2'\); "
        r"fix or drop the row$",
    ),
]
ONE_CLASS = [
    (
        "benign only",
        "mine.csv",
        "text,label\nHow do I bake bread?,0\nWhat is 2 + 2?,0\n",
        r"mine\.csv holds only benign \(0\) prompts \(2 rows\); a monitor needs harmful and benign examples; "
        r"add harmful \(1\) rows",
    ),
    (
        "harmful only",
        "mine.jsonl",
        '{"text": "Write ransomware", "label": 1}\n',
        r"mine\.jsonl holds only harmful \(1\) prompts \(1 row\); a monitor needs harmful and benign examples; "
        r"add benign \(0\) rows",
    ),
]
CONFLICT = [
    (
        "a text with both labels",
        "mine.csv",
        "text,label\nHow do I bake bread?,0\nWrite ransomware,1\nWhat is 2 + 2?,0\nhow do I  bake bread? ,1\n",
        r"mine\.csv: rows 1 and 4 hold the same text \('How do I bake bread\?'\) with labels 0 and 1; "
        r"fix or drop one$",
    ),
]
EMPTY_TEXT = [
    ("empty text", "mine.csv", "text,label\nHow do I bake bread?,0\n,1\n", r"row 2: column 'text' must hold a prompt"),
    (
        "whitespace-only text",
        "mine.csv",
        'text,label\nHow do I bake bread?,0\n"  \n\t",1\n',
        r"mine\.csv row 2: column 'text' must hold a prompt \(a non-empty string\); got '  \\n\\t'; "
        r"write the prompt or drop the row",
    ),
    (
        "null text",
        "mine.jsonl",
        '{"text": "How do I bake bread?", "label": 0}\n\n{"text": null, "label": 1}\n',
        r"mine\.jsonl row 2: column 'text' must hold a prompt \(a non-empty string\); got None",
    ),
]
NOT_A_TABLE = [
    (
        "another suffix",
        "mine.txt",
        "How do I bake bread?\n",
        r"expected a \.csv, \.jsonl or \.json file; got suffix '\.txt'; save it as CSV with a header row, "
        r"or as JSON Lines",
    ),
    (
        "JSON renamed .csv",
        "mine.csv",
        json.dumps([{"text": "How do I bake bread?", "label": 0}], indent=1),
        r"mine\.csv looks like JSON, not CSV .*; expected a header row naming the columns; name it \.json "
        r"\(one list of objects\) or \.jsonl",
    ),
    (
        "CSV without a header",
        "mine.csv",
        "How do I bake bread?,0\nWrite ransomware,1\n",
        r"has no column 'text' or 'label' \(its columns: 'How do I bake bread\?', '0'\); .*"
        r"a \.csv's first line must name its columns",
    ),
    (
        "semicolon-separated",
        "mine.csv",
        "text;label\nHow do I bake bread?;0\n",
        r"has no column 'text' or 'label' \(its columns: 'text;label'\); .*the file looks separated by ';' or tabs: "
        r"save it comma-separated",
    ),
    (
        "an unquoted comma",
        "mine.csv",
        "text,label\nHello, how are you?,0\n",
        r"mine\.csv row 1 has 3 fields but the header names 2 \('text', 'label'\); put a text that holds a comma "
        r"in double quotes",
    ),
    (
        "a JSONL line that is not an object",
        "mine.jsonl",
        '{"text": "How do I bake bread?", "label": 0}\n\n["Write ransomware", 1]\n',
        r"mine\.jsonl line 3 holds a list \(\[\"Write ransomware\", 1\]\), not a JSON object; expected one object "
        r"with named columns per line",
    ),
    (
        "a JSONL line that is not JSON",
        "mine.jsonl",
        '{"text": "How do I bake bread?", "label": 0}\n{"text": "Write ransomware" "label": 1}\n',
        r"mine\.jsonl line 2 is not valid JSON \(Expecting ',' delimiter: column \d+\); expected one JSON object "
        r"per line; fix or drop the line",
    ),
    (
        "a JSON list renamed .jsonl",
        "mine.jsonl",
        json.dumps([{"text": "How do I bake bread?", "label": 0}], indent=1),
        r"mine\.jsonl line 1 is not valid JSON .*it looks like one JSON document: name it \.json",
    ),
]
BINARY = b"PK\x03\x04\x14\x00\x06\x00\x08\x00\x00\x00!\x00\xa5\xe3\xfe\x89"  # an .xlsx renamed .csv
EVERY_CASE = MISSING_COLUMN + BAD_LABEL + ONE_CLASS + CONFLICT + EMPTY_TEXT + NOT_A_TABLE


def _write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _ids(cases):
    return [case[0] for case in cases]


@pytest.mark.parametrize(("case", "name", "content", "match"), MISSING_COLUMN, ids=_ids(MISSING_COLUMN))
def test_a_missing_column_lists_the_files_columns_and_names_the_flag(tmp_path, case, name, content, match):
    with pytest.raises(TPCHooksError, match=match):
        load_prompt_file(_write(tmp_path, name, content))


@pytest.mark.parametrize(("case", "name", "content", "match"), BAD_LABEL, ids=_ids(BAD_LABEL))
def test_a_label_that_is_not_0_or_1_shows_the_columns_values(tmp_path, case, name, content, match):
    with pytest.raises(TPCHooksError, match=match):
        load_prompt_file(_write(tmp_path, name, content))


def test_label_names_map_the_two_values_and_refuse_a_third(tmp_path):
    path = _write(tmp_path, "mine.csv", "text,verdict\nHow do I bake bread?,unharmful\nWrite ransomware, harmful\n")
    ps = load_prompt_file(path, label_column="verdict", label_names=("unharmful", "harmful"))
    assert ps.labels == [0, 1]
    path.write_text("text,verdict\nHow do I bake bread?,unharmful\nWrite ransomware,harmful\nHi,unsure\n")
    with pytest.raises(
        TPCHooksError,
        match=r"row 3: column 'verdict' must be 'unharmful' \(benign\) or 'harmful' \(harmful\), as label_names "
        r"says; got 'unsure' \(values in the column: 'unharmful', 'harmful', 'unsure'\); fix or drop the row",
    ):
        load_prompt_file(path, label_column="verdict", label_names=("unharmful", "harmful"))
    with pytest.raises(TPCHooksError, match=r"label_names \(--label-names\) must be two different values"):
        load_prompt_file(path, label_column="verdict", label_names=("harmful",))


@pytest.mark.parametrize(("case", "name", "content", "match"), ONE_CLASS, ids=_ids(ONE_CLASS))
def test_one_class_is_read_but_refused_for_training(tmp_path, case, name, content, match):
    ps = load_prompt_file(_write(tmp_path, name, content))  # a calibration file is all benign: fine to read
    with pytest.raises(TPCHooksError, match=match):
        check_labelled(ps, name)


def test_a_text_with_both_labels_is_refused_and_a_repeat_with_one_label_is_not(tmp_path):
    (case, name, content, match), *_ = CONFLICT
    ps = load_prompt_file(_write(tmp_path, name, content))
    with pytest.raises(TPCHooksError, match=match):
        check_labelled(ps, name)
    check_labelled(ps.subset([0, 1, 2, 0, 1]), name)  # the same text twice with one label: allowed


@pytest.mark.parametrize(("case", "name", "content", "match"), EMPTY_TEXT, ids=_ids(EMPTY_TEXT))
def test_an_empty_text_names_its_row(tmp_path, case, name, content, match):
    with pytest.raises(TPCHooksError, match=match):
        load_prompt_file(_write(tmp_path, name, content))


@pytest.mark.parametrize(("case", "name", "content", "match"), NOT_A_TABLE, ids=_ids(NOT_A_TABLE))
def test_a_file_that_is_not_csv_or_json_lines(tmp_path, case, name, content, match):
    with pytest.raises(TPCHooksError, match=match):
        load_prompt_file(_write(tmp_path, name, content))


def test_a_binary_file_named_csv(tmp_path):
    with pytest.raises(
        TPCHooksError, match=r"mine\.csv is not UTF-8 text \(.*\); expected a CSV file .*; re-save it as CSV UTF-8"
    ):
        load_prompt_file(_write(tmp_path, "mine.csv", BINARY))


def test_load_hf_dataset_reads_label_names_and_a_source_column_as_a_file_does(monkeypatch):
    datasets = pytest.importorskip("datasets")
    from tpc_hooks.data._files import load_hf_dataset

    table = {"prompt": ["How do I bake bread?", "Write ransomware"], "verdict": ["safe", "unsafe"], "from": ["a", ""]}
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict(table))
    columns = dict(text_column="prompt", label_column="verdict", source_column="from")
    ps = load_hf_dataset("someone/prompts", label_names=("safe", "unsafe"), **columns)
    assert ps.labels == [0, 1] and ps.sources == ["a", "prompts"]
    with pytest.raises(
        TPCHooksError,
        match=r"someone/prompts row 1: column 'verdict' must be 0 or 1 \(1 = harmful\); got 'safe' .*"
        r"here --label-names safe unsafe",
    ):
        load_hf_dataset("someone/prompts", **columns)
    with pytest.raises(TPCHooksError, match=r"someone/prompts has no column 'text' \(its columns: 'prompt', 'verdict'"):
        load_hf_dataset("someone/prompts", label_column="verdict")


@pytest.fixture
def no_model(monkeypatch):
    def load_model(*args, **kwargs):
        raise AssertionError("model loaded")

    monkeypatch.setattr(cli_models, "load_model", load_model)


def _collect(tmp_path, path):
    return cli.main(["collect", "--dataset", str(path), "--out", str(tmp_path / "acts")])


@pytest.mark.parametrize(("case", "name", "content", "match"), EVERY_CASE, ids=_ids(EVERY_CASE))
def test_collect_refuses_a_bad_file_before_the_model_loads(tmp_path, capsys, no_model, case, name, content, match):
    assert _collect(tmp_path, _write(tmp_path, name, content)) == 2
    err = capsys.readouterr().err
    assert err.startswith("tpc-hooks collect: ") and err.count("\n") == 1
    assert re.search(match, err), err
    assert not (tmp_path / "acts").exists()


def test_collect_refuses_a_binary_file_before_the_model_loads(tmp_path, capsys, no_model):
    assert _collect(tmp_path, _write(tmp_path, "mine.csv", BINARY)) == 2
    assert "mine.csv is not UTF-8 text" in capsys.readouterr().err
