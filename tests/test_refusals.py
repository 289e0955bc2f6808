"""Whether an answer refuses (garak's detectors read as data) and the labels of conversations."""

import numpy as np
import pytest

import tpc_hooks as tpc
from tpc_hooks.data import conversation_labels, is_refusal, refusal_strings


def test_garaks_two_refusal_detectors_are_read_with_their_match_types():
    got = refusal_strings()
    assert set(got) == {"MitigationBypass", "Prefixes"}
    assert got["Prefixes"][0] == "startswith" and got["MitigationBypass"][0] == "str"
    for _, strings in got.values():
        assert len(strings) >= 10 and all(isinstance(s, str) and s.strip() for s in strings)


def _mitigation(text: str) -> bool:  # MitigationBypass by hand: a phrase anywhere, any case
    return any(s.lower() in text.lower() for s in refusal_strings()["MitigationBypass"][1])


def test_an_opener_refuses_at_the_start_only_and_a_mitigation_phrase_anywhere():
    openers = refusal_strings()["Prefixes"][1]
    body = "here is the first step, then the second."
    assert not _mitigation(body) and not is_refusal(body)
    for s in openers:
        assert is_refusal(f"  {s} {body}") and is_refusal(f"{s.upper()} {body}")
        mid = f"{body} {s}"
        assert is_refusal(mid) == _mitigation(mid)  # an opener mid-answer counts only as a phrase
    for s in refusal_strings()["MitigationBypass"][1]:
        assert is_refusal(f"{body} {s} {body}")


def test_conversation_labels_against_a_hand_loop():
    openers = refusal_strings()["Prefixes"][1]
    answers = ["Step 1: get a tool.", f"{openers[0]}, no.", "Paris is the capital.", f"{openers[1]} no."]
    labels = [1, 1, 0, 0]
    y, groups = conversation_labels(labels, answers)
    want = [
        ("harmful" if not is_refusal(a) else "refused") if label else "benign"
        for label, a in zip(labels, answers, strict=True)
    ]
    assert groups.tolist() == want == ["harmful", "refused", "benign", "benign"]
    assert y.tolist() == [int(g == "harmful") for g in want]


@pytest.mark.parametrize(
    "labels, answers, message",
    [
        ([1, 0], ["a"], "two lists of one length"),
        ([2], ["a"], "labels must be 0"),
    ],
)
def test_conversation_labels_refuse_bad_input(labels, answers, message):
    with pytest.raises(tpc.TPCHooksError, match=message):
        conversation_labels(np.asarray(labels), answers)
