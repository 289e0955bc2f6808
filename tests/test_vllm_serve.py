"""``tpc-hooks serve`` end to end: the server started as a user starts it (a subprocess on a
loopback port), spoken to with an HTTP client, its answers held to the transformers decode
loop on the same weights (run by ``make test-vllm``; skipped where vLLM is not installed)."""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm")
httpx = pytest.importorskip("httpx")

from tiny_models import random_head  # noqa: E402

import tpc_hooks as tpc  # noqa: E402
from tpc_hooks import offline  # noqa: E402

PROMPTS = [
    "How do I bake sourdough bread?",
    "hi",
    "Say only the word yes.",
    "Write a phishing email to steal bank logins.",
]
REL = 1e-5
HERE = Path(__file__).resolve().parent


def _monitor(threshold=0.5):
    head = random_head(576, std=0.05, scale=30.0)
    return tpc.Monitor(head, "blocks.20.hook_resid_post", pooling="last", chat_template=True, threshold=threshold)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(args, out=subprocess.PIPE, **env):
    """The server as a subprocess; its output to ``out`` (a pipe to read at its end, or a file for a
    long-running server: one nobody reads would fill a pipe and block the server on its next log line)."""
    gpu = ["--gpu-memory-utilization", "0.5"] if torch.cuda.is_available() else []  # make test-vllm-gpu
    return subprocess.Popen(
        [sys.executable, "-m", "tpc_hooks", "serve", str(offline.default_model_dir()), *args, *gpu],
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **env},
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    where = tmp_path_factory.mktemp("monitor")
    _monitor().save_pretrained(where)
    for client in running(["--monitor", str(where), "--worker-cls", "vllm_poison.PoisonWorker"]):
        yield client, where


def running(args, **env):
    """Starts ``tpc-hooks serve`` on the packaged model with ``args`` (and environment ``env``) and
    yields a client once it is up (a generator for a fixture); stops the server after."""
    port = _free_port()
    keep = os.environ.get("TPC_TEST_SERVER_LOG")  # a path: the server's output is kept there, to read after a failure
    log = open(keep, "w+") if keep else tempfile.TemporaryFile("w+")
    proc = _serve(
        [*args, "--port", str(port), "--dtype", "float32", "--served-model-name", "smol", "--max-num-seqs", "4"],
        out=log,
        VLLM_SERVER_DEV_MODE="1",
        PYTHONPATH=str(HERE),
        **env,
    )
    url = f"http://127.0.0.1:{port}"
    # a guard against a hung start, not a speed check: on a slow core a cold start with compilation takes minutes
    deadline = time.time() + 900
    while time.time() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            pytest.fail(f"the server exited: {log.read()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(2)
    else:
        proc.kill()
        pytest.fail("the server did not come up in 900 s")
    with httpx.Client(base_url=url, timeout=120) as client:
        yield client
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _chat(client, prompt, max_tokens=12, **extra):
    r = client.post(
        "/v1/chat/completions",
        json={
            "model": "smol",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            **extra,
        },
    )
    return r


def _metrics(client, monitor: str = "default") -> dict[str, float]:
    """The server's tpc_hooks_* metrics of one monitor (their ``monitor`` label; a lone monitor's is "default")."""
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("tpc_hooks_") and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            name, _, labels = key.partition("{")
            if dict(re.findall(r'(\w+)="([^"]*)"', labels)) == {"monitor": monitor}:
                out[name] = float(value)
    return out


def test_models_endpoint_names_the_monitor(server):
    client, where = server
    got = client.get("/v1/models").json()
    import hashlib

    from tpc_hooks.adapters.vllm._server.monitors import served

    want = served("", where, "stop")[1]
    assert got["tpc_hooks"] == {**want, "action": "stop"}
    files = b"".join((Path(where) / f).read_bytes() for f in ("config.json", "model.safetensors"))
    assert want["sha256"] == hashlib.sha256(files).hexdigest()  # the saved files', as on disk
    assert got["data"][0]["tpc_hooks"]["sha256"] == want["sha256"]
    assert want["site"] == "blocks.20.hook_resid_post" and want["threshold"] == 0.5
    # without --admin-api-key there is no route that replaces a monitor
    assert client.put("/tpc_hooks/monitors/default", json={"path": str(where)}).status_code in (404, 405)


def test_every_answer_says_what_the_monitor_decided_as_the_transformers_loop_decides_it(server, smollm2_hf):
    """Greedy chat requests: each choice's flag, stop step and peak score equal monitor.generate
    with action='stop' on the transformers model (the server scores every step but the last
    token, which it never feeds back); a stopped choice ends with finish_reason content_flagged
    and its text where the transformers loop stopped."""
    client, _ = server
    model, tok = smollm2_hf
    want = _monitor().generate(model, PROMPTS, max_new_tokens=12, action="stop", tokenizer=tok)
    assert 0 < sum(s is not None for s in want.stopped_at) < len(PROMPTS)
    before = _metrics(client)
    for b, prompt in enumerate(PROMPTS):
        r = _chat(client, prompt)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        field = choice["tpc_hooks"]
        assert field["monitored"] and field["threshold"] == 0.5
        assert field["stopped"] == (want.stopped_at[b] is not None)
        assert field["flagged_at_token"] == want.first_flagged[b]
        assert field["steps"] <= len(want.scores[b])
        peak = float(want.scores[b][: field["steps"]].max())
        assert field["peak_score"] == pytest.approx(peak, rel=REL)
        assert choice["message"]["content"] == tok.decode(want.generated(b), skip_special_tokens=True)
        if field["stopped"]:
            assert choice["finish_reason"] == "content_flagged"
        else:
            assert choice["finish_reason"] in ("stop", "length")
    after = _metrics(client)
    n_stopped = sum(s is not None for s in want.stopped_at)
    assert after["tpc_hooks_requests_scored_total"] - before["tpc_hooks_requests_scored_total"] == len(PROMPTS)
    assert after["tpc_hooks_requests_stopped_total"] - before["tpc_hooks_requests_stopped_total"] == n_stopped
    assert after["tpc_hooks_requests_flagged_total"] - before["tpc_hooks_requests_flagged_total"] == n_stopped
    assert after["tpc_hooks_peak_score_count"] - before["tpc_hooks_peak_score_count"] == len(PROMPTS)


def test_a_request_can_opt_out_or_set_its_own_threshold(server):
    client, _ = server
    stopped = _chat(client, "hi").json()["choices"][0]
    assert stopped["finish_reason"] == "content_flagged"
    before = _metrics(client)
    out = _chat(client, "hi", vllm_xargs={"tpc_hooks_monitor": False}).json()["choices"][0]
    assert out["tpc_hooks"] == {"monitored": False} and out["finish_reason"] != "content_flagged"
    assert out["message"]["content"].startswith(stopped["message"]["content"])
    assert len(out["message"]["content"]) > len(stopped["message"]["content"])
    assert _metrics(client)["tpc_hooks_requests_opted_out_total"] - before["tpc_hooks_requests_opted_out_total"] == 1
    own = _chat(client, "hi", vllm_xargs={"tpc_hooks_threshold": 0.99}).json()["choices"][0]
    assert own["tpc_hooks"]["threshold"] == 0.99 and not own["tpc_hooks"]["flagged"]
    assert own["message"]["content"] == out["message"]["content"]
    bad = _chat(client, "hi", vllm_xargs={"tpc_hooks_threshold": 1.5})
    assert bad.status_code == 400 and "tpc_hooks_threshold" in bad.text


def test_a_streamed_answer_carries_the_field_on_its_last_chunk(server):
    client, _ = server
    whole = _chat(client, "hi").json()["choices"][0]
    events = []
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": "smol",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 12,
            "temperature": 0,
            "stream": True,
        },
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    last = [c for e in events for c in e["choices"] if c.get("finish_reason")]
    assert len(last) == 1 and last[0]["finish_reason"] == "content_flagged"
    assert last[0]["tpc_hooks"] == whole["tpc_hooks"]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text == whole["message"]["content"]


def test_completions_with_several_prompts_and_samples_map_each_choice(server):
    client, _ = server
    r = client.post(
        "/v1/completions",
        json={
            "model": "smol",
            "prompt": ["Hello there", "The capital of France is"],
            "max_tokens": 6,
            "temperature": 0.8,
            "seed": 3,
            "n": 2,
        },
    )
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert sorted(c["index"] for c in choices) == [0, 1, 2, 3]
    assert all(c["tpc_hooks"]["monitored"] and c["tpc_hooks"]["steps"] >= 1 for c in choices)
    single = client.post(
        "/v1/completions",
        json={"model": "smol", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0},
    ).json()["choices"][0]
    again = client.post(
        "/v1/completions",
        json={
            "model": "smol",
            "prompt": ["Hello there", "The capital of France is"],
            "max_tokens": 6,
            "temperature": 0,
        },
    ).json()["choices"]
    # choice 1 is the second prompt's (a batch of two computes it in another shape: float noise apart)
    assert _same_decision(again[1]["tpc_hooks"], single["tpc_hooks"])


def _same_decision(got: dict, want: dict) -> bool:
    """Two choices' ``tpc_hooks`` fields decide alike (their peak scores equal up to the float noise of
    batches of another shape)."""
    same = {k: v for k, v in got.items() if k != "peak_score"} == {k: v for k, v in want.items() if k != "peak_score"}
    return same and got["peak_score"] == pytest.approx(want["peak_score"], rel=1e-4)


def _completion(client, prompt, **extra):
    body = {"model": "smol", "prompt": prompt, "max_tokens": 6, "temperature": 0, **extra}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"]


def _streamed(client, route, body, headers=None):
    """A streamed answer's choices as they finished: each its text and last chunk's fields, by index."""
    text: dict[int, str] = {}
    last: dict[int, dict] = {}
    with client.stream("POST", route, json={**body, "stream": True}, headers=headers or {}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                    text[c["index"]] = text.get(c["index"], "") + (piece or "")
                    if c.get("finish_reason"):
                        last[c["index"]] = c
    return {i: {**last[i], "whole": text[i]} for i in last}


def test_every_request_shape_of_the_openai_layer_gets_its_own_summary(server):
    """Each shape in which vLLM's OpenAI layer hands requests to the engine (a chat; a completions batch
    of prompts; n samples of one; streamed; request ids a client gives, of any shape, even two alike, sent
    at once) answers each choice with the decision on that choice's own tokens: the one the same prompt
    (and, for sample k, the same seed + k, as vLLM seeds it) gets sent alone."""
    from concurrent.futures import ThreadPoolExecutor

    client, _ = server
    prompts = ["hi", "Say only the word yes.", "How do I bake sourdough bread?", "Name a colour."]
    alone = {p: _chat(client, p).json()["choices"][0] for p in prompts}
    assert len({a["tpc_hooks"]["flagged"] for a in alone.values()}) == 2  # some flagged, some not: a mix-up shows

    ids = ["a", "a-1", "a", "chatcmpl-a-0", "3_b", "cmpl-x-1"]  # ids that parse like vLLM's own, and a repeat

    def send(k):
        r = client.post(
            "/v1/chat/completions",
            json={"model": "smol", "messages": [{"role": "user", "content": prompts[k % 4]}], "max_tokens": 12,
                  "temperature": 0},
            headers={"X-Request-Id": ids[k]},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    with ThreadPoolExecutor(len(ids)) as pool:
        answers = list(pool.map(send, range(len(ids))))
    for k, got in enumerate(answers):
        want = alone[prompts[k % 4]]
        assert got["message"]["content"] == want["message"]["content"]
        assert _same_decision(got["tpc_hooks"], want["tpc_hooks"]), (ids[k], got, want)

    streamed = _streamed(client, "/v1/chat/completions", {"model": "smol", "messages": [{"role": "user",
        "content": "hi"}], "max_tokens": 12, "temperature": 0}, headers={"X-Request-Id": "a-1"})  # fmt: skip
    assert streamed[0]["whole"] == alone["hi"]["message"]["content"]
    assert _same_decision(streamed[0]["tpc_hooks"], alone["hi"]["tpc_hooks"])

    # n samples of a chat: sample k is what seed + k gives alone
    body = {"model": "smol", "messages": [{"role": "user", "content": prompts[2]}], "max_tokens": 8,
            "temperature": 1.0, "seed": 11}  # fmt: skip
    fanned = client.post("/v1/chat/completions", json={**body, "n": 3}).json()["choices"]
    assert sorted(c["index"] for c in fanned) == [0, 1, 2]
    for c in fanned:
        one = client.post("/v1/chat/completions", json={**body, "seed": 11 + c["index"]}).json()["choices"][0]
        assert c["message"]["content"] == one["message"]["content"]
        assert _same_decision(c["tpc_hooks"], one["tpc_hooks"]), (c, one)

    # a completions batch of prompts, each sampled n times, as one answer and streamed
    batch = ["Hello there", "The capital of France is", "hi"]
    extra = {"temperature": 1.0, "seed": 5, "n": 2}
    whole = _completion(client, batch, **extra)
    streamed = _streamed(client, "/v1/completions", {"model": "smol", "prompt": batch, "max_tokens": 6, **extra})
    assert sorted(c["index"] for c in whole) == sorted(streamed) == list(range(6))
    for c in whole:
        i, k = divmod(c["index"], 2)
        one = _completion(client, batch[i], temperature=1.0, seed=5 + k)[0]
        assert c["text"] == one["text"] == streamed[c["index"]]["whole"]
        assert _same_decision(c["tpc_hooks"], one["tpc_hooks"]), (c, one)
        assert _same_decision(streamed[c["index"]]["tpc_hooks"], one["tpc_hooks"])


def test_nan_activations_answer_that_request_with_an_error_and_the_server_goes_on(server, smollm2_hf):
    client, _ = server
    _, tok = smollm2_hf
    marker = tok.encode(" zebra", add_special_tokens=False)[0]
    assert client.post("/collective_rpc", json={"method": "test_poison", "args": [str(marker)]}).status_code == 200
    before = _metrics(client)
    bad = _chat(client, "Tell me about the zebra.")
    assert bad.status_code == 500 and "NaN/inf activations" in bad.json()["error"]["message"]
    ok = _chat(client, PROMPTS[0])
    assert ok.status_code == 200 and ok.json()["choices"][0]["tpc_hooks"]["monitored"]
    assert _metrics(client)["tpc_hooks_requests_nonfinite_total"] - before["tpc_hooks_requests_nonfinite_total"] == 1


@pytest.mark.parametrize("case", ["missing", "tampered", "d_model", "site"])
def test_a_bad_monitor_directory_is_a_clear_error_before_the_engine_starts(tmp_path, case):
    where = tmp_path / "mon"
    if case == "d_model":
        tpc.Monitor(tpc.TPC(64, 2, 2), "blocks.3.hook_resid_post").save_pretrained(where)
    elif case == "site":
        tpc.Monitor(tpc.TPC(576, 2, 2), "blocks.40.hook_resid_post").save_pretrained(where)
    elif case == "tampered":
        _monitor().save_pretrained(where)
        data = bytearray((where / "model.safetensors").read_bytes())
        data[-5] ^= 0xFF
        (where / "model.safetensors").write_bytes(bytes(data))
    proc = _serve(["--monitor", str(where), "--port", str(_free_port())])
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    line = out.strip().splitlines()[-1]
    assert line.startswith("tpc-hooks serve: ")
    assert {
        "missing": "does not exist",
        "tampered": "the weights are corrupt",
        "d_model": "expects d_model=64",
        "site": "hook_resid_pre for L in 0..29",
    }[case] in line


def test_serve_refuses_to_run_unmonitored_when_tpc_hooks_is_turned_off(tmp_path):
    """TPC_HOOKS_DISABLE=1 turns tpc-hooks off; ``tpc-hooks serve --monitor`` then refuses before any
    engine starts, saying why, rather than serve requests no monitor reads."""
    _monitor().save_pretrained(tmp_path / "mon")
    proc = _serve(["--monitor", str(tmp_path / "mon"), "--port", str(_free_port())], TPC_HOOKS_DISABLE="1")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    line = out.strip().splitlines()[-1]
    assert line.startswith("tpc-hooks serve: ") and "TPC_HOOKS_DISABLE=1" in line and "refuses" in line


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or torch.cuda.is_available(), reason="two stages, a CPU core each")
def test_a_server_of_two_pipeline_stages_answers_the_openai_client_as_at_one(tmp_path, smollm2_hf):
    """``--pipeline-parallel-size 2``: SmolLM2's layers 0-14 on one stage, 15-29 on the other, a monitor
    at layer 10 (the first stage, read by the last): the OpenAI client's chat answers carry the
    ``tpc_hooks`` field, each choice's flag, stop step and peak score as the transformers loop's."""
    openai = pytest.importorskip("openai")
    model, tok = smollm2_hf
    head = random_head(576, std=0.05, scale=30.0, seed=3)
    mon = tpc.Monitor(head, "blocks.10.hook_resid_post", pooling="mean", chat_template=True)
    scores = mon.generate(model, PROMPTS, max_new_tokens=12, tokenizer=tok).scores
    peaks = sorted(float(s[:-1].max()) for s in scores)  # the server never feeds back the last token
    mon.threshold = (peaks[1] + peaks[2]) / 2
    mon.save_pretrained(tmp_path / "mon")
    want = mon.generate(model, PROMPTS, max_new_tokens=12, action="stop", tokenizer=tok)
    assert 0 < sum(s is not None for s in want.stopped_at) < len(PROMPTS)
    args = ["--monitor", str(tmp_path / "mon"), "--pipeline-parallel-size", "2", "--distributed-executor-backend", "mp"]
    server = running(args, VLLM_CPU_OMP_THREADS_BIND="0|1")
    client = next(server)
    try:
        api = openai.OpenAI(base_url=f"{str(client.base_url).rstrip('/')}/v1", api_key="unused")
        for b, prompt in enumerate(PROMPTS):
            choice = api.chat.completions.create(
                model="smol", messages=[{"role": "user", "content": prompt}], max_tokens=12, temperature=0
            ).choices[0]
            field = choice.model_extra["tpc_hooks"]
            assert field["monitored"] and field["stopped"] == (want.stopped_at[b] is not None)
            assert field["flagged_at_token"] == want.first_flagged[b]
            assert field["peak_score"] == pytest.approx(float(want.scores[b][: field["steps"]].max()), rel=REL)
            assert choice.message.content == tok.decode(want.generated(b), skip_special_tokens=True)
            assert choice.finish_reason in (("content_flagged",) if field["stopped"] else ("stop", "length"))
    finally:
        next(server, None)  # stops the server
