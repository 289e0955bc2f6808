"""``tpc-hooks serve`` with several monitors (``--monitor NAME=DIR:ACTION``, repeated): each
answer carries each monitor's decision by name, held to a MonitorSet on the transformers model;
the finish reason names the monitor that stopped a request; the metrics are labelled by
monitor; a request can opt out of, or re-threshold, one monitor by name (run by ``make
test-vllm``; skipped where vLLM is not installed)."""

import json
import math
import re
import subprocess
import threading
import time

import pytest
import torch

pytest.importorskip("vllm")
pytest.importorskip("httpx")

from test_vllm_serve import PROMPTS, REL, _chat, _free_port, _metrics, _monitor, _serve, running  # noqa: E402
from tiny_models import random_head  # noqa: E402

import tpc_hooks as tpc  # noqa: E402

EARLY = "blocks.10.hook_resid_post"
KEY = "s3cret"
ADMIN = {"Authorization": f"Bearer {KEY}"}


def _early(threshold=0.5):
    head = random_head(576, std=0.05, scale=30.0, seed=7)
    return tpc.Monitor(head, EARLY, pooling="mean", chat_template=True, threshold=threshold)


@pytest.fixture(scope="module")
def expected(smollm2_hf):
    """The set on the transformers model: "harm" stops, "early" (another layer, mean pooling) flags
    with a threshold some requests cross and others do not."""
    model, tok = smollm2_hf
    early = _early()
    peaks = sorted(float(s.max()) for s in early.generate(model, PROMPTS, max_new_tokens=12, tokenizer=tok).scores)
    early.threshold = (peaks[1] + peaks[2]) / 2
    harm = _monitor()
    harm.report["operating_point"] = {"fpr": 0.05}  # the rate it was calibrated to: the drift gauges' target
    monitors = tpc.MonitorSet({"harm": harm, "early": early}, actions={"harm": "stop"})
    return monitors, monitors.generate(model, PROMPTS, max_new_tokens=12, tokenizer=tok)


@pytest.fixture(scope="module")
def set_server(tmp_path_factory, expected):
    monitors, _ = expected
    dirs = {}
    for name, mon in monitors.items():
        dirs[name] = tmp_path_factory.mktemp(name)
        mon.save_pretrained(dirs[name])
    dirs["log"] = tmp_path_factory.mktemp("review")
    dirs["sae"] = tmp_path_factory.mktemp("sae") / "early"
    early_sae().save_model(dirs["sae"])  # explains the monitor at its site in its features, by label
    (dirs["sae"] / "labels.json").write_text(
        json.dumps({str(i): {"label": f"<f{i}>", "tokens": [], "prompts": []} for i in range(0, 64, 2)})
    )
    for client in running(
        [
            "--monitor",
            f"harm={dirs['harm']}:stop",
            "--monitor",
            f"early={dirs['early']}:flag",
            "--drift-window",
            "3",
            "--admin-api-key",
            KEY,
            "--review-log",
            str(dirs["log"]),
            "--review-log-sample",
            "0.5",
            "--review-log-text",
            "--review-log-sae",
            str(dirs["sae"]),
        ]
    ):
        yield client, dirs


def early_sae():
    """A small random SAELens SAE on the "early" monitor's site (its cfg records the hook name)."""
    import sae_lens

    torch.manual_seed(0)
    sae = sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=576, d_sae=64))
    with torch.no_grad():
        for p in sae.parameters():
            p.normal_(0, 0.05)
    sae.cfg.metadata.hook_name = EARLY
    return sae


def test_models_endpoint_names_each_monitor(set_server):
    client, dirs = set_server
    from tpc_hooks.adapters.vllm._server.monitors import served

    got = client.get("/v1/models").json()["tpc_hooks"]
    assert got["harm"]["target_fpr"] == 0.05 and got["early"]["target_fpr"] is None
    assert got == {
        "harm": {**served("harm", dirs["harm"], "stop")[1], "action": "stop"},
        "early": {**served("early", dirs["early"], "flag")[1], "action": "flag"},
    }


def test_each_answer_carries_each_monitors_decision_by_name(set_server, expected, smollm2_hf):
    client, _ = set_server
    monitors, want = expected
    _, tok = smollm2_hf
    assert "harm" in want.stopped_by and any(want["early"].flagged) and not all(want["early"].flagged)
    before = {name: _metrics(client, name) for name in monitors}
    flagged = {name: 0 for name in monitors}
    recent = []
    for b, prompt in enumerate(PROMPTS):
        r = _chat(client, prompt)
        assert r.status_code == 200, r.text
        recent = (recent + [r])[-3:]
        choice = r.json()["choices"][0]
        assert set(choice["tpc_hooks"]) == {"harm", "early"}
        for name in monitors:
            field, run = choice["tpc_hooks"][name], want[name]
            assert field["monitored"] and field["threshold"] == pytest.approx(monitors[name].threshold)
            assert field["stopped"] == (run.stopped_at[b] is not None)
            assert field["flagged_at_token"] == run.first_flagged[b]
            assert field["peak_score"] == pytest.approx(float(run.scores[b][: field["steps"]].max()), rel=REL)
            flagged[name] += field["flagged"]
        assert choice["message"]["content"] == tok.decode(want.generated(b), skip_special_tokens=True)
        if want.stopped_by[b] is not None:
            assert choice["finish_reason"] == f"content_flagged:{want.stopped_by[b]}"
        else:
            assert choice["finish_reason"] in ("stop", "length")
    for name in monitors:
        after = _metrics(client, name)
        grew = {k: after[k] - before[name].get(k, 0.0) for k in after}
        assert grew["tpc_hooks_requests_scored_total"] == len(PROMPTS)
        assert grew["tpc_hooks_requests_stopped_total"] == sum(by == name for by in want.stopped_by)
        assert grew["tpc_hooks_requests_flagged_total"] == flagged[name]
        assert grew["tpc_hooks_peak_score_count"] == len(PROMPTS)
    assert flagged["early"] > 0
    # the drift gauges: the flag rate over the last 3 scored requests, over the server's life, and the target
    last = {name: [r.json()["choices"][0]["tpc_hooks"][name]["flagged"] for r in recent] for name in monitors}
    for name in monitors:
        rates = _rates(client, name)
        counts = _metrics(client, name)
        assert rates["lifetime"] == pytest.approx(
            counts["tpc_hooks_requests_flagged_total"] / counts["tpc_hooks_requests_scored_total"]
        )
        assert rates["recent"] == pytest.approx(sum(last[name]) / 3)
    assert _rates(client, "harm")["target"] == 0.05 and "target" not in _rates(client, "early")


def _rates(client, monitor: str) -> dict[str, float]:
    """tpc_hooks_flag_rate of one monitor, by window."""
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("tpc_hooks_flag_rate{"):
            key, value = line.rsplit(" ", 1)
            labels = dict(re.findall(r'(\w+)="([^"]*)"', key))
            if labels.get("monitor") == monitor:
                out[labels["window"]] = float(value)
    return out


def _logged(log_dir, response_ids, timeout=30.0):
    """The review-log entries of ``response_ids`` (the log's thread writes them soon after the answers)."""
    from tpc_hooks import read_review_log

    end = time.monotonic() + timeout
    while True:
        got = {e["response_id"]: e for e in read_review_log(log_dir) if e["response_id"] in response_ids}
        if len(got) == len(response_ids) or time.monotonic() > end:
            return got
        time.sleep(0.2)


def test_the_review_log_explains_each_flagged_request_as_attribute_does_offline(set_server, expected, smollm2_hf):
    """Every flagged answer is logged (and about half the others, the sample); each monitor's steps
    equal its transformers run; the attribution of the step that flagged equals tpc.attribute of the
    same prefix's activations on the transformers model, and its orders up to the step's exit order
    sum to the step's logit; the text is the answer's; the answers carry no review."""
    from tpc_hooks.adapters import get_adapter
    from tpc_hooks.adapters.vllm._review import sampled

    client, dirs = set_server
    monitors, want = expected
    model, tok = smollm2_hf
    answers = [_chat(client, p) for p in PROMPTS]
    assert all(r.status_code == 200 for r in answers)
    assert all("review" not in r.json()["choices"][0]["tpc_hooks"][n] for r in answers for n in monitors)
    flagged = {r.json()["id"] for b, r in enumerate(answers) if any(want[n].flagged[b] for n in monitors)}
    assert flagged
    logged = _logged(dirs["log"], {r.json()["id"] for r in answers})
    assert flagged <= set(logged)
    first = next(iter(monitors.values()))
    ids, _ = get_adapter(model, tokenizer=tok).tokenize(
        PROMPTS, chat_template=True, max_tokens=first.max_tokens, prepend_bos=first.prepend_bos
    )
    for b, r in enumerate(answers):
        e = logged.get(r.json()["id"])
        if e is None:  # neither flagged nor in the sample
            continue
        assert e["flagged"] == (r.json()["id"] in flagged) and e["choice"] == 0
        steps = len(next(iter(e["monitors"].values()))["scores"])
        assert e["text"]["prompt"] == tok.decode(ids[b])
        assert e["text"]["completion"] == [tok.decode([t]) for t in want.generated(b)[: steps - 1]]
        for name, m in e["monitors"].items():
            run, mon = want[name], monitors[name]
            steps = len(m["scores"])
            assert m["scores"] == pytest.approx(run.scores[b][:steps].tolist(), rel=1e-4, abs=1e-6)
            assert m["flagged"] == run.flagged[b]
            assert m["step"] == (run.first_flagged[b] if run.flagged[b] else int(run.scores[b][:steps].argmax()))
            assert m["sampled"] == sampled(e["request_id"], 0.5)
            prefix = ids[b] + want.generated(b)[: m["step"]]
            with __import__("torch").no_grad():
                acts = model(__import__("torch").tensor([prefix]), output_hidden_states=True).hidden_states
            layer = int(mon.site.split(".")[1]) + 1
            offline = tpc.attribute(mon, acts[layer].float())
            a = m["attribution"]
            assert a["by_order"] == pytest.approx(offline.by_order[0].tolist(), rel=1e-3, abs=1e-4)
            assert a["logit"] == pytest.approx(float(offline.logit[0]), rel=1e-3, abs=1e-4)
            assert sum(a["by_order"][: a["exit_order"]]) == pytest.approx(a["step_logit"])
            assert a["top_neurons"][0][0] == offline.top_neurons(1)[0][0]
            if mon.site == EARLY:  # --review-log-sae: the same decision in the SAE's features, by label
                from tpc_hooks.adapters._sae_lens import read_sae

                feats = tpc.attribute(mon, acts[layer].float(), sae=read_sae(dirs["sae"])).top_neurons(3)
                assert [i for i, _ in a["features"]["top_features"][:3]] == [i for i, _ in feats]
                named = {int(u): v for u, v in a["features"]["labels"].items()}
                units = [i for i, _ in a["features"]["top_features"] if i != "error"]  # "error": what the SAE misses
                assert units and all(named[i] == f"<f{i}>" for i in units if i % 2 == 0)
                assert all(u % 2 == 0 for u in named)  # only the labelled ones
            else:
                assert "features" not in a
            # the step's score is the sigmoid of its logit (no cascade: one order, uncalibrated)
            assert 1 / (1 + math.exp(-a["step_logit"])) == pytest.approx(m["scores"][m["step"]], rel=1e-3)
    # the review log's metrics count what it wrote
    written = sum(
        float(line.rsplit(" ", 1)[1])
        for line in client.get("/metrics").text.splitlines()
        if line.startswith('tpc_hooks_review_log_entries_total{outcome="written"}')
    )
    assert written >= len(logged)


def test_a_request_opts_out_of_or_rethresholds_one_monitor_by_name(set_server):
    client, _ = set_server
    stopped = _chat(client, "hi").json()["choices"][0]
    assert stopped["finish_reason"] == "content_flagged:harm"
    before = _metrics(client, "harm")
    out = _chat(client, "hi", vllm_xargs={"tpc_hooks_monitor.harm": False}).json()["choices"][0]
    assert out["tpc_hooks"]["harm"] == {"monitored": False} and out["tpc_hooks"]["early"]["monitored"]
    assert out["finish_reason"] in ("stop", "length")
    assert len(out["message"]["content"]) > len(stopped["message"]["content"])
    assert (
        _metrics(client, "harm")["tpc_hooks_requests_opted_out_total"]
        - before.get("tpc_hooks_requests_opted_out_total", 0.0)
        == 1
    )
    own = _chat(client, "hi", vllm_xargs={"tpc_hooks_threshold.harm": 0.99}).json()["choices"][0]
    assert own["tpc_hooks"]["harm"]["threshold"] == 0.99 and not own["tpc_hooks"]["harm"]["stopped"]
    assert own["tpc_hooks"]["early"]["threshold"] == stopped["tpc_hooks"]["early"]["threshold"]
    bad = _chat(client, "hi", vllm_xargs={"tpc_hooks_monitor.pii": False})
    assert bad.status_code == 400 and "names no monitor of this server" in bad.text and "harm, early" in bad.text


def test_several_monitors_each_need_a_name(tmp_path):
    _monitor().save_pretrained(tmp_path / "a")
    proc = _serve(["--monitor", str(tmp_path / "a"), "--monitor", str(tmp_path / "a"), "--port", str(_free_port())])
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 2 and "several monitors need a name each" in out.strip().splitlines()[-1]


# ---------------------------------------------------------------------- replacing a monitor without a restart
def test_the_admin_route_needs_its_key(set_server):
    client, dirs = set_server
    body = {"path": str(dirs["harm"])}
    assert client.put("/tpc_hooks/monitors/harm", json=body).status_code == 401
    assert (
        client.put("/tpc_hooks/monitors/harm", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    )
    assert client.get("/tpc_hooks/monitors/harm", headers=ADMIN).status_code == 405


def test_a_bad_directory_is_refused_and_the_old_monitor_keeps_serving(set_server, tmp_path):
    client, dirs = set_server
    before = client.get("/v1/models").json()["tpc_hooks"]
    for body, why in [
        ({"path": str(tmp_path / "missing")}, "does not exist"),
        ({"path": str(dirs["harm"]), "action": "halt"}, "action must be"),
        ({"where": "x"}, "the body must be"),
    ]:
        r = client.put("/tpc_hooks/monitors/harm", json=body, headers=ADMIN)
        assert r.status_code == 400 and why in r.json()["error"], r.text
    other = tmp_path / "other-site"
    tpc.Monitor(random_head(576, std=0.05, scale=30.0), "blocks.5.hook_resid_post", chat_template=True).save_pretrained(
        other
    )
    r = client.put("/tpc_hooks/monitors/harm", json={"path": str(other)}, headers=ADMIN)
    assert r.status_code == 400 and "--sites" in r.json()["error"]
    assert client.delete("/tpc_hooks/monitors/pii", headers=ADMIN).status_code == 400
    assert client.get("/v1/models").json()["tpc_hooks"] == before
    assert _chat(client, "hi").json()["choices"][0]["finish_reason"] == "content_flagged:harm"


def test_a_monitor_is_replaced_under_32_clients_and_in_flight_requests_finish_on_the_old_one(
    set_server, tmp_path, smollm2_hf
):
    """32 clients send requests while "harm" (threshold 0.5, stops "hi") is replaced by the same head at
    threshold 0.99: every answer is whole and carries one of the two monitors; every request sent after
    the swap returned gets the new one, and scores as the transformers loop scores it (the prefix cache
    was emptied and the prefix recomputed under the new monitor); then one is removed and another added."""
    client, dirs = set_server
    first = _chat(client, "hi").json()["choices"][0]
    assert first["tpc_hooks"]["harm"]["threshold"] == 0.5 and first["finish_reason"] == "content_flagged:harm"
    new = tmp_path / "harm-099"
    mon = tpc.Monitor.from_pretrained(dirs["harm"])
    mon.threshold = 0.99
    mon.save_pretrained(new)
    results, swapped, stop = [], {}, threading.Event()

    def client_loop(k):
        import httpx

        with httpx.Client(base_url=str(client.base_url), timeout=300) as c:
            while not stop.is_set():
                sent = time.monotonic()
                r = _chat(c, ["hi", "Say only the word yes.", "How do I bake sourdough bread?"][k % 3], max_tokens=8)
                results.append((sent, time.monotonic(), r.status_code, r.json() if r.status_code == 200 else r.text))

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(32)]
    for t in threads:
        t.start()
    time.sleep(8)
    swapped["from"] = time.monotonic()
    r = client.put("/tpc_hooks/monitors/harm", json={"path": str(new)}, headers=ADMIN)
    swapped["at"] = time.monotonic()
    time.sleep(8)
    stop.set()
    for t in threads:
        t.join()
    assert r.status_code == 200 and r.json()["threshold"] == 0.99, r.text
    assert all(code == 200 for _, _, code, _ in results), [x for x in results if x[2] != 200][:2]
    thresholds = [(sent, done, body["choices"][0]["tpc_hooks"]["harm"]["threshold"]) for sent, done, _, body in results]
    assert {t for _, _, t in thresholds} == {0.5, 0.99}
    assert all(t == 0.99 for sent, _, t in thresholds if sent > swapped["at"])
    # requests running when the swap came finished after it, on the monitor they started with
    assert any(t == 0.5 for sent, done, t in thresholds if sent < swapped["from"] and done > swapped["at"])
    assert client.get("/v1/models").json()["tpc_hooks"]["harm"]["sha256"] != first_sha(dirs)
    after = _chat(client, "hi").json()["choices"][0]
    assert after["finish_reason"] in ("stop", "length") and not after["tpc_hooks"]["harm"]["flagged"]
    model, tok = smollm2_hf  # the new monitor scores "hi" as the transformers loop does (its prefix recomputed)
    want = tpc.Monitor.from_pretrained(new).generate(model, ["hi"], max_new_tokens=12, tokenizer=tok)
    field = after["tpc_hooks"]["harm"]
    assert field["peak_score"] == pytest.approx(float(want.scores[0][: field["steps"]].max()), rel=REL)
    # removing a monitor, then adding one under a new name
    assert client.delete("/tpc_hooks/monitors/early", headers=ADMIN).json() == {"removed": "early"}
    assert set(_chat(client, "hi").json()["choices"][0]["tpc_hooks"]) == {"harm"}
    r = client.put("/tpc_hooks/monitors/late", json={"path": str(dirs["early"]), "action": "flag"}, headers=ADMIN)
    assert r.status_code == 200
    assert set(client.get("/v1/models").json()["tpc_hooks"]) == {"harm", "late"}
    r = _chat(client, "hi", vllm_xargs={"tpc_hooks_monitor.late": False})
    assert r.status_code == 200, r.text
    got = r.json()["choices"][0]["tpc_hooks"]
    assert got["late"] == {"monitored": False} and got["harm"]["monitored"]
    assert "tpc_hooks_requests_scored_total" in _metrics(client, "late")


def first_sha(dirs):
    from tpc_hooks.adapters.vllm._server.monitors import served

    return served("harm", dirs["harm"], "stop")[1]["sha256"]


def test_a_response_monitor_stops_an_answer_at_the_answer_token_the_transformers_loop_does(
    set_server, tmp_path, smollm2_hf
):
    """A response monitor (reads="answer") added through the admin route, with a threshold some
    answers cross: each answer's field says at which answer token it crossed (never the prompt), the
    stopped answers end with its finish reason and the text where the transformers loop stopped; the
    review log says it read the answer. The other monitors are opted out, then it is removed."""
    client, dirs = set_server
    model, tok = smollm2_hf
    head = random_head(576, std=0.05, scale=30.0, seed=11)
    mon = tpc.Monitor(head, "blocks.20.hook_resid_post", pooling="mean", chat_template=True, reads="answer")
    peaks = sorted(float(s.max()) for s in mon.generate(model, PROMPTS, max_new_tokens=12, tokenizer=tok).scores)
    mon.threshold = (peaks[1] + peaks[2]) / 2
    want = mon.generate(model, PROMPTS, max_new_tokens=12, action="stop", tokenizer=tok)
    assert 0 < sum(s is not None for s in want.stopped_at) < len(PROMPTS)
    mon.save_pretrained(tmp_path / "answers")
    r = client.put(
        "/tpc_hooks/monitors/answers", json={"path": str(tmp_path / "answers"), "action": "stop"}, headers=ADMIN
    )
    assert r.status_code == 200, r.text
    others = {f"tpc_hooks_monitor.{n}": False for n in client.get("/v1/models").json()["tpc_hooks"] if n != "answers"}
    ids = []
    for b, prompt in enumerate(PROMPTS):
        r = _chat(client, prompt, vllm_xargs=others)
        assert r.status_code == 200, r.text
        ids.append(r.json()["id"])
        choice = r.json()["choices"][0]
        field = choice["tpc_hooks"]["answers"]
        assert field["flagged_at_token"] == want.first_flagged[b] and field["stopped"] == (
            want.stopped_at[b] is not None
        )
        assert field["flagged_at_token"] is None or field["flagged_at_token"] >= 1
        assert field["peak_score"] == pytest.approx(float(want.scores[b][: field["steps"]].max()), rel=REL)
        assert choice["message"]["content"] == tok.decode(want.generated(b), skip_special_tokens=True)
        if field["stopped"]:
            assert choice["finish_reason"] == "content_flagged:answers"
    logged = _logged(dirs["log"], [i for b, i in enumerate(ids) if want.first_flagged[b] is not None])
    assert logged and all(e["monitors"]["answers"]["of"] == "answer" for e in logged.values())
    assert client.delete("/tpc_hooks/monitors/answers", headers=ADMIN).json() == {"removed": "answers"}
