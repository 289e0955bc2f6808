"""The review log's parts that run without vLLM: what a worker keeps of a request (the input of
the step it explains, equal to the offline pool of the same prefix), the explanation (equal to
``tpc.attribute``; its orders up to the exit order sum to the step's logit), the writer under
load (every entry written or counted as dropped, none both), rotation and reading, peak scores
for ``Monitor.calibrate``, and the HTML pages."""

import json
import threading

import pytest
import torch
from tiny_models import random_head

import tpc_hooks as tpc
from tpc_hooks.adapters.vllm._review import Notes, ReviewLog, entry, explain, explain_entry
from tpc_hooks.monitoring._requests import RequestScores
from tpc_hooks.pooling import POOLINGS, pool

D = 8


def _monitor(pooling="mean", **kw):
    return tpc.Monitor(random_head(D, std=0.5, seed=3), "blocks.0.hook_resid_post", pooling=pooling, **kw)


@pytest.mark.parametrize("pooling", [*POOLINGS, "token"])
def test_the_kept_input_is_the_offline_input_of_the_same_prefix(pooling):
    """RequestScores' inputs (a prompt in two chunks, then decode steps beside another request)
    equal the monitor's pool of the same prefix computed at once; the explanation of that input
    equals tpc.attribute of it."""
    torch.manual_seed(0)
    mon = _monitor(pooling)
    rs = RequestScores(mon)
    rs.keep_inputs = True
    rows = {"a": torch.randn(9, D), "b": torch.randn(6, D)}
    got = {"a": [], "b": []}
    feed = [
        [("a", rows["a"][:3], False), ("b", rows["b"][:4], True)],
        [("a", rows["a"][3:6], True)],
        [("a", rows["a"][6:7], True), ("b", rows["b"][4:5], True)],
        [("b", rows["b"][5:6], True), ("a", rows["a"][7:8], True)],
        [("a", rows["a"][8:9], True)],
    ]
    for pieces in feed:
        done, res = rs.update(pieces)
        for j, rid in enumerate(done):
            got[rid].append(rs.inputs[j].clone())
    for rid, ends in (("a", [6, 7, 8, 9]), ("b", [4, 5, 6])):
        assert len(got[rid]) == len(ends)
        for z, t in zip(got[rid], ends, strict=True):
            x = rows[rid][:t]
            want = x[-1] if pooling == "token" else pool(x[None], torch.ones(1, t), pooling)[0]
            torch.testing.assert_close(z, want)
            part = explain(mon, z, exit_order=mon.head.degree, k=3)
            attr = tpc.attribute(mon.head, want)  # independent: the head on the offline input
            assert part["by_order"] == pytest.approx(attr.by_order[0].tolist(), rel=1e-5, abs=1e-6)
            assert part["step_logit"] == pytest.approx(float(attr.logit[0]), rel=1e-5, abs=1e-6)


def test_a_truncated_step_sums_its_kept_orders():
    """With a cascade exit at order 1, the step's logit is order 1's: bias + linear."""
    mon = _monitor()
    z = torch.randn(D)
    part = explain(mon, z, exit_order=1)
    assert part["step_logit"] == pytest.approx(float(mon.head(z[None], order=1)[0].detach()), rel=1e-5)
    assert part["exit_order"] == 1 and len(part["by_order"]) == mon.head.degree


def test_notes_keep_the_first_flagged_step_or_the_highest_of_a_sampled_request():
    """The worker keeps the input of the step to explain; the server's log thread explains it with
    the monitor whose files hash to the worker's ``sha``, as tpc.attribute does."""
    mon, other = _monitor(), _monitor(pooling="last")
    notes = Notes(sample=1.0)
    zs = [torch.randn(D) for _ in range(4)]
    notes.seen("s", 0, 0.2, zs[0])
    notes.seen("s", 1, 0.6, zs[1])
    notes.seen("s", 2, 0.4, zs[2])
    notes.flagged("f", 3, zs[3])
    rec = {"probs": torch.tensor([0.2, 0.6, 0.4, float("nan")]), "exit_order": torch.tensor([2, 2, 1, 2])}
    s = notes.take("s", mon, "abc", rec, list(range(20)), 10)
    assert s["step"] == 1 and s["sampled"] and s["scores"][3] is None and s["monitor"] == "abc"
    assert s["tokens_sha256"] and "ids" not in s  # a hash of the 13 scored tokens' ids, no text unless asked
    f = notes.take("f", mon, "abc", rec, None, 0)
    assert f["step"] == 3 and "tokens_sha256" not in f
    assert notes.take("s", mon, "abc", rec, None, 0) is None  # taken once
    notes.flagged("n", 0, torch.full((D,), float("nan")))
    n = notes.take("n", mon, "abc", rec, None, 0)
    e = explain_entry(
        {"monitors": {"a": s, "b": f, "c": n, "d": {**f, "monitor": "unknown"}}}, {"abc": mon, "xyz": other}, k=3
    )
    assert "input" not in s and s["attribution"]["exit_order"] == 2
    assert s["attribution"]["by_order"] == pytest.approx(tpc.attribute(mon, zs[1]).by_order[0].tolist(), rel=1e-5)
    assert f["attribution"]["logit"] == pytest.approx(float(tpc.attribute(mon, zs[3]).logit[0]), rel=1e-5)
    assert "non-finite" in e["monitors"]["c"]["attribution"]["error"]
    assert "unknown" in e["monitors"]["d"]["attribution"]["error"]


def test_the_log_under_load_writes_or_counts_every_entry(tmp_path):
    """Eight threads put 4000 entries into a queue of 16 with 2 kB rotation, the first half while
    the writer is held (the queue fills: drops are certain), the second half while it writes:
    every entry is either in the files exactly once or counted as dropped (and absent), each
    thread's entries keep their order across the rotated files, and the counts add up."""
    gate = threading.Event()

    def prepare(e):
        gate.wait()
        return {**e, "done": True}

    log = ReviewLog(tmp_path, max_bytes=2048, backups=1000, queue_size=16, prepare=prepare)
    accepted = [[] for _ in range(8)]

    def put(k, half):
        for i in range(250 * half, 250 * (half + 1)):
            e = {
                "request_id": f"{k}-{i}",
                "response_id": f"{k}-{i}",
                "monitors": {"": {"peak_score": 0.1}},
                "pad": "x" * 200,
            }
            if log.put(e):
                accepted[k].append(e["request_id"])

    for half in (0, 1):
        threads = [threading.Thread(target=put, args=(k, half)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if half == 0:
            assert log.counts["dropped"] >= 2000 - 17 and log.counts["written"] == 0  # held: at most 16 + 1 wait
            gate.set()
    counts = log.close()
    got = tpc.read_review_log(tmp_path)
    assert all(e["done"] for e in got)  # finished on the log's thread
    ids = [e["request_id"] for e in got]
    assert len(ids) == len(set(ids)) == counts["written"]
    assert sorted(ids) == sorted(i for a in accepted for i in a)
    assert counts["written"] + counts["dropped"] == 4000 and counts["failed"] == 0
    assert len(list(tmp_path.glob("review.jsonl*"))) >= 2  # rotated
    for k in range(8):  # one thread's entries keep their order across the rotated files
        assert [i for i in ids if i.startswith(f"{k}-")] == accepted[k]


def test_reading_a_log_cut_short_or_corrupt(tmp_path):
    good = {"request_id": "a", "monitors": {}}
    (tmp_path / "review.jsonl").write_text(json.dumps(good) + "\n" + '{"request_id": "b", "moni')
    with pytest.warns(UserWarning, match="cut short"):
        assert tpc.read_review_log(tmp_path) == [good]
    (tmp_path / "review.jsonl").write_text("not json\n" + json.dumps(good) + "\n")
    with pytest.raises(tpc.TPCHooksError, match="review.jsonl:1"):
        tpc.read_review_log(tmp_path)
    with pytest.raises(tpc.TPCHooksError, match="no review log"):
        tpc.read_review_log(tmp_path / "nowhere")


def _summary(flagged, peak, review):
    return {
        "steps": 3,
        "peak_score": peak,
        "flagged": flagged,
        "first_flagged": 1 if flagged else None,
        "stopped_at": None,
        "threshold": 0.5,
        "nonfinite_step": None,
        **({"review": review} if review else {}),
    }


def test_entries_take_the_reviews_out_of_the_summaries_and_decode_the_text():
    mon = _monitor()
    review = {
        "request_id": "chatcmpl-x-1",
        "sampled": False,
        "step": 1,
        "of": "pool",
        "scores": [0.1, 0.7, 0.6],
        "exit_orders": [2, 2, 2],
        "monitor": "abc",
        "input": torch.randn(D).tolist(),
        "ids": [5, 6, 7, 8],
        "prompt_len": 2,
    }
    per = {"harm": _summary(True, 0.7, review), "pii": _summary(False, 0.2, None), "off": None}
    e = entry("chatcmpl-x", 0, 1.5, per, decode=lambda ids: "|".join(map(str, ids)))
    assert all("review" not in s for s in per.values() if s)  # the answer's field keeps none of it
    assert e["request_id"] == "chatcmpl-x-1" and e["flagged"] and list(e["monitors"]) == ["harm"]
    assert e["text"] == {"prompt": "5|6", "completion": ["7", "8"]}
    assert "ids" not in e["monitors"]["harm"]
    assert explain_entry(e, {"abc": mon})["monitors"]["harm"]["attribution"]["by_order"] == pytest.approx(
        tpc.attribute(mon, torch.tensor(review["input"])).by_order[0].tolist(), rel=1e-5
    )
    assert entry("r", 0, 0.0, {"pii": _summary(False, 0.2, None)}) is None


def _log(tmp_path, entries):
    (tmp_path / "review.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    return tmp_path


def _entry(k, peak, sampled, flagged):
    m = {
        "flagged": flagged,
        "first_flagged": 0 if flagged else None,
        "stopped_at": None,
        "peak_score": peak,
        "threshold": 0.5,
        "sampled": sampled,
        "step": 0,
        "of": "pool",
        "scores": [peak],
        "exit_orders": [2],
        "attribution": explain(_monitor(), torch.randn(D), 2, k=3),
    }
    return {
        "request_id": f"r{k}",
        "response_id": f"resp{k}",
        "choice": 0,
        "time": 0.0,
        "flagged": flagged,
        "monitors": {"harm": m},
    }


def test_logged_peaks_calibrate_a_monitor(tmp_path):
    """Only the sampled entries (flagged ones are all logged: counting them biases the rate), only
    those marked benign; the threshold leaves at most fpr of them at or above it, the same bound
    as a threshold computed by hand from the sorted peaks."""
    g = torch.Generator().manual_seed(1)
    peaks = torch.rand(300, generator=g).tolist()
    entries = [_entry(k, p, True, p >= 0.5) for k, p in enumerate(peaks)] + [
        _entry(1000 + k, 0.99, False, True) for k in range(50)
    ]
    log = tpc.read_review_log(_log(tmp_path, entries))
    got = tpc.logged_peaks(log, "harm")
    assert got == pytest.approx(peaks)
    benign = [f"r{k}" for k in range(0, 300, 2)]
    mine = tpc.logged_peaks(log, "harm", benign=benign)
    assert mine == pytest.approx(peaks[::2])
    mon = _monitor().calibrate(peaks=mine, fpr=0.05)
    over = sum(p >= mon.threshold for p in mine)
    assert over <= int(0.05 * len(mine)) and mon.report["operating_point"]["n_benign"] == len(mine)
    kth = sorted(mine)[len(mine) - 1 - int(0.05 * len(mine))]  # the highest peak left unflagged
    assert kth < mon.threshold <= min(p for p in mine if p > kth)
    with pytest.raises(tpc.TPCHooksError, match="no sampled entry of monitor 'pii'"):
        tpc.logged_peaks(log, "pii")
    with pytest.raises(tpc.TPCHooksError, match="not both"):
        _monitor().calibrate("model", ["x"], peaks=mine)
    with pytest.raises(tpc.TPCHooksError, match=r"scores in \[0, 1\]"):
        _monitor().calibrate(peaks=[0.2, 1.5])


def test_the_pages_escape_the_text_and_link_every_entry(tmp_path, capsys):
    from tpc_hooks.cli import main
    from tpc_hooks.views import render_review_log

    entries = [_entry(k, 0.9 if k % 2 else 0.1, True, bool(k % 2)) for k in range(5)]
    entries[1]["text"] = {"prompt": "<script>alert(1)</script>", "completion": []}
    log = _log(tmp_path, entries)
    assert main(["review", str(log)]) == 0
    pages = sorted((tmp_path / "html").glob("entry-*.html"))
    assert len(pages) == 5 and "5 pages" in capsys.readouterr().out
    index = (tmp_path / "html" / "index.html").read_text()
    assert all(f'href="{p.name}"' in index for p in pages) and index.count("flagged</td>") == 2
    page = pages[1].read_text()
    assert "&lt;script&gt;" in page and "<script>" not in page and page.count("<table>") >= 3
    assert render_review_log(log, tmp_path / "flagged", flagged_only=True).exists()
    assert len(list((tmp_path / "flagged").glob("entry-*.html"))) == 2
    assert main(["review", str(tmp_path / "nowhere")]) == 2


def test_a_response_monitors_kept_input_is_its_answer_pooled_and_the_pages_say_where_it_crossed(tmp_path):
    """The worker leaves a response monitor's prompt rows out: the input kept for a step is the
    answer's tokens so far pooled (the prompt's end, step 0, is unscored); the pages say at which
    answer token the score crossed."""
    from tpc_hooks.views import review_html
    from tpc_hooks.views._review import review_pages

    mon = _monitor("mean", reads="answer")
    rs = RequestScores(mon)
    rs.keep_inputs = True
    rows = torch.randn(8, D, generator=torch.Generator().manual_seed(2))
    none = rows[:0]
    got = []
    for pieces in ([("a", none, False)], [("a", none, True)], [("a", rows[5:6], True)], [("a", rows[6:7], True)]):
        done, res = rs.update(pieces)
        if done:
            got.append((float(res.logits[0]), rs.inputs[0].clone()))
    assert len(got) == 3 and got[0][0] == float("-inf")
    for t, (logit, z) in enumerate(got[1:], start=1):
        torch.testing.assert_close(z, rows[5 : 5 + t].mean(0))
        assert logit == pytest.approx(float(mon.head(z[None])[0]), rel=1e-5)
    e = _entry(0, 0.9, False, True)
    e["monitors"]["harm"].update(first_flagged=2, step=2, of="answer", scores=[0.0, 0.3, 0.9], exit_orders=[2, 2, 2])
    page = str(review_html(e))
    assert "flagged at answer token 2" in page and "pooled answer input" in page
    index = review_pages([e, _entry(1, 0.9, False, True)], tmp_path / "pages").read_text()
    assert "at answer token 2" in index and "on the prompt" in index
