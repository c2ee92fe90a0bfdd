"""`hftoolkit serve`: trained runs behind the OpenAI API on loopback, tried with OpenAI's own client.

The server runs in this process, in a thread, on a socket bound to 127.0.0.1 port 0 (any free one); only the
shutdown test starts it as a command, since its process is what is under test. Answers are checked against
`predict`'s for the same inputs and settings.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers import RECIPES, needs, run_cli, train_recipe
from tests.helpers.processes import kill_tree, start_in_group
from tests.helpers.serving import QUICK, gathered, predicted, serving

pytestmark = needs("fastapi", "openai")

ENCODER, PREFERENCE = RECIPES / "encoder-classification.yaml", RECIPES / "decoder-preference.yaml"


@pytest.fixture(scope="session")
def tiny_runs(tmp_path_factory):
    """Two classification adapters on one tiny BERT and a tiny GPT-2 tuned on pairs (it answers chats)."""
    root = tmp_path_factory.mktemp("serve")
    for seed in (1, 2):
        train_recipe(ENCODER, root / f"labels{seed}", *QUICK, f"training.seed={seed}")
    train_recipe(PREFERENCE, root / "chat", *QUICK)
    return root


@pytest.mark.slow
def test_adapters_on_one_base_share_it_and_one_batch_serves_both(tiny_runs):
    import httpx

    texts = ["a fine film", "dull and slow", "great acting", "not good"]
    pairs = [("first", tiny_runs / "labels1"), ("second", tiny_runs / "labels2")]
    with serving(pairs, max_wait=0.5) as (url, served, batcher):
        assert served["first"].base is served["second"].base, "one copy of the base"
        with gathered(batcher, requests=2 * len(texts)), ThreadPoolExecutor(8) as pool:  # both adapters at once
            answers = list(pool.map(lambda job: httpx.post(f"{url}/v1/classifications", json={
                "model": job[0], "input": job[1]}, timeout=60).json(), [(n, t) for n, _ in pairs for t in texts]))
        assert batcher.batches < len(answers) and batcher.most_adapters == 2, "one batch served both adapters"
    for (name, run), start in zip(pairs, (0, len(texts))):
        expected = [predicted(run, "--input", t)[0] for t in texts]
        got = [a["data"][0] for a in answers[start:start + len(texts)]]
        assert [g["label"] for g in got] == [e["label"] for e in expected], name
        assert [g["probability"] for g in got] == pytest.approx([e["probability"] for e in expected], abs=2e-4)
    assert answers[0]["data"][0]["probability"] != answers[len(texts)]["data"][0]["probability"], \
        "each adapter answers with its own weights"


@pytest.mark.slow
def test_merged_and_fully_fine_tuned_runs_are_served_as_they_are(tiny_runs, tmp_path):
    import httpx

    run_cli("merge", tiny_runs / "labels1", "--output", tmp_path / "merged")
    train_recipe(ENCODER, tmp_path / "full", *QUICK, "lora.enabled=false")
    texts = ["a fine film", "dull and slow"]
    pairs = [("adapter", tiny_runs / "labels1"), ("merged", tmp_path / "merged"), ("full", tmp_path / "full")]
    with serving(pairs) as (url, served, _):
        assert served["merged"].adapter is None and served["full"].adapter is None
        assert len({id(run.base) for run in served.values()}) == 3
        answers = {name: httpx.post(f"{url}/v1/classifications", json={"model": name, "input": texts},
                                    timeout=60).json()["data"] for name, _ in pairs}
    # The merged folder answers as its adapter run does, the full run as predict does.
    assert [r["label"] for r in answers["merged"]] == [r["label"] for r in answers["adapter"]]
    assert [r["probability"] for r in answers["merged"]] == pytest.approx(
        [r["probability"] for r in answers["adapter"]], abs=2e-4)
    expected = [predicted(tmp_path / "full", "--input", t)[0] for t in texts]
    assert [r["label"] for r in answers["full"]] == [e["label"] for e in expected]
    assert [r["probability"] for r in answers["full"]] == pytest.approx([e["probability"] for e in expected],
                                                                       abs=2e-4)


@pytest.mark.slow
def test_a_tagging_run_tags_the_words_as_predict_does(tmp_path):
    import httpx

    train_recipe(RECIPES / "encoder-tagging.yaml", tmp_path / "tags", *QUICK)
    with serving([("tags", tmp_path / "tags")]) as (url, _, _):
        answer = httpx.post(f"{url}/v1/classifications", json={"model": "tags", "input": "Anna flew to Rome"},
                            timeout=60).json()["data"][0]
    expected = predicted(tmp_path / "tags", "--input", "Anna flew to Rome")[0]
    assert answer == {"index": 0, **expected}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["seq2seq-translation-t5.yaml", "decoder-clm.yaml"])
def test_a_seq2seq_or_clm_run_completes_and_streams_as_predict_writes(tmp_path, recipe):
    import httpx

    train_recipe(RECIPES / recipe, tmp_path / "run", *QUICK, "eval.generation.max_new_tokens=8")
    source = "the cat sees the dog"
    with serving([("writer", tmp_path / "run")]) as (url, _, _):
        # (sampled, seeded as predict seeds it: a tiny random model's greedy choice may be an empty text)
        request = {"model": "writer", "prompt": source, "max_tokens": 8, "temperature": 1.0}
        whole = httpx.post(f"{url}/v1/completions", json=request, timeout=60).json()["choices"][0]["text"]
        events = httpx.post(f"{url}/v1/completions", json={**request, "stream": True}, timeout=60).text
        chat = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
            "model": "writer", "messages": [{"role": "user", "content": source}]})
    pieces = [json.loads(line[6:]) for line in events.splitlines() if line.startswith("data: {")]
    assert events.rstrip().endswith("data: [DONE]") and pieces[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert "".join(p["choices"][0]["text"] for p in pieces) == whole
    assert whole and whole == predicted(tmp_path / "run", "--input", source, "--max-new-tokens", "8", "--strategy",
                                        "sample", "--temperature", "1.0")[0]["text"]
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "wrong_endpoint"  # (it reads no conversation)


@pytest.mark.slow
def test_bad_requests_get_their_4xx_in_openai_s_shape_and_the_next_request_is_answered(tiny_runs):
    import httpx

    key = {"Authorization": "Bearer sesame"}
    good = {"model": "labels", "input": "a fine film"}
    pairs = [("labels", tiny_runs / "labels1"), ("chat", tiny_runs / "chat")]
    with serving(pairs, api_key="sesame", max_input_tokens=16, max_tokens=8, max_body_bytes=2000) as (url, _, _):
        bad = {
            "malformed JSON": (dict(content=b"{not json", headers={**key, "content-type": "application/json"}),
                               "/v1/classifications", 400, "invalid_request"),
            "unknown model": (dict(json={**good, "model": "nope"}, headers=key), "/v1/classifications", 404,
                              "model_not_found"),
            "chat to a classification run": (dict(json={"model": "labels", "messages": [
                {"role": "user", "content": "hi"}]}, headers=key), "/v1/chat/completions", 400, "wrong_endpoint"),
            "missing key": (dict(json=good), "/v1/classifications", 401, "invalid_api_key"),
            "wrong key": (dict(json=good, headers={"Authorization": "Bearer guess"}), "/v1/classifications", 401,
                          "invalid_api_key"),
            "input over the limit": (dict(json={**good, "input": "word " * 40}, headers=key), "/v1/classifications",
                                     400, "context_length_exceeded"),
            "max_tokens over the limit": (dict(json={"model": "chat", "prompt": "hi", "max_tokens": 9}, headers=key),
                                          "/v1/completions", 400, "invalid_request"),
            "body over the limit": (dict(json={**good, "input": ["a"] * 1000}, headers=key), "/v1/classifications",
                                    413, "body_too_large"),
            "body of unknown size": (dict(content=iter([json.dumps(good).encode()]), headers=key),
                                     "/v1/classifications", 411, "length_required"),
            "a pair to a single-text run": (dict(json={**good, "input": [["a", "b"]]}, headers=key),
                                            "/v1/classifications", 400, "invalid_request"),
            "unknown path": (dict(json=good, headers=key), "/v1/embeddings", 404, "not_found"),
        }
        for case, (request, path, status, code) in bad.items():
            answer = httpx.post(url + path, timeout=60, **request)
            assert answer.status_code == status, (case, answer.text)
            error = answer.json()["error"]
            assert error["code"] == code and error["message"] and error["type"], case
            after = httpx.post(f"{url}/v1/classifications", json=good, headers=key, timeout=60)
            assert after.status_code == 200 and after.json()["data"][0]["label"], f"after {case}"
        assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "ok"  # (no key needed)


@pytest.mark.slow
def test_a_server_on_another_address_needs_an_api_key_and_a_port_in_use_is_said(monkeypatch, tiny_runs):
    monkeypatch.delenv("HFTOOLKIT_API_KEY", raising=False)
    result = run_cli("serve", tiny_runs / "labels1", "--host", "0.0.0.0", expect=2)
    assert "needs an API key: set HFTOOLKIT_API_KEY" in result.output
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_cli("serve", tiny_runs / "labels1", "--port", port, expect=2)
    assert f"--port {port}: can't listen there (Address already in use)" in result.output
    assert "model loaded" not in result.output, "said before the models load"
    from hftoolkit.cli.serving import listening

    with listening("127.0.0.1", 0) as sock:  # (asyncio sets TCP_NODELAY on what it accepts only from a TCP socket:
        assert sock.proto == socket.IPPROTO_TCP  # without it each response waited out a 40 ms delayed ACK)


@pytest.mark.slow
def test_sigterm_lets_the_requests_in_flight_finish_then_exits_in_one_line(tiny_runs):
    import httpx

    process = start_in_group([sys.executable, "-m", "hftoolkit", "serve", f"chat={tiny_runs / 'chat'}", "--port",
                              "0", "--max-batch", "1"], stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in process.stderr:
            if line.startswith("serving "):
                url = line.split(" on ")[1].strip()
                break
        assert url, "the server said where it listens"
        request = {"model": "chat", "prompt": "Name a colour.", "max_tokens": 64, "temperature": 0}
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(httpx.post, f"{url}/v1/completions", json=request, timeout=120) for _ in range(4)]
            time.sleep(1.0)  # (the first is being answered, the others wait in the queue)
            process.send_signal(signal.SIGTERM)
            answers = [f.result() for f in futures]
        rest = process.stderr.read()
        assert process.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        kill_tree(process)
    assert all(a.status_code == 200 and a.json()["choices"][0]["text"] is not None for a in answers)
    said = [line for line in rest.splitlines() if line.strip()]
    assert said == ["stopped by SIGTERM: 4 requests answered"], said


@pytest.mark.slow
def test_openai_s_client_lists_chats_streams_and_classifies_as_predict_answers(tiny_smollm2, tmp_path):
    """SmolLM2 (the tiny stand-in: its tokenizer and chat template) tuned on instructions, two adapters on MiniLM:
    the `openai` package against the server."""
    import openai

    from tests.helpers.hub_cache import minilm_folder

    instruct = tmp_path / "instruct"
    train_recipe(RECIPES / "smollm2-instruct.yaml", instruct, f"model.checkpoint={tiny_smollm2}",
                 "model.gguf_file=null", "model.revision=null", "data.max_train_samples=16", "data.max_eval_samples=2",
                 "training.max_steps=1", "training.batch_size=8", "eval.generation.max_new_tokens=12",
                 "eval.max_predictions=0")
    for seed in (1, 2):
        train_recipe(ENCODER, tmp_path / f"sentiment{seed}", *QUICK, f"model.checkpoint={minilm_folder()}",
                     f"training.seed={seed}")
    question = [{"role": "user", "content": "What is 2 plus 3?"}]
    conversation = tmp_path / "question.jsonl"
    conversation.write_text(json.dumps({"messages": question}) + "\n")
    pairs = [("assistant", instruct), ("sentiment1", tmp_path / "sentiment1"), ("sentiment2", tmp_path / "sentiment2")]
    with serving(pairs) as (url, _, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        assert sorted(m.id for m in client.models.list()) == ["assistant", "sentiment1", "sentiment2"]
        chat = client.chat.completions.create(model="assistant", messages=question, max_tokens=12, temperature=0)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model="assistant", messages=question, max_tokens=12, temperature=0, stream=True))
        text = client.completions.create(model="assistant", prompt="What is 2 plus 3?", max_tokens=12).choices[0].text
        labels = {name: client.post("/classifications", cast_to=object, body={"model": name, "input": [
            "a warm, funny film", "a dull mess"]}) for name in ("sentiment1", "sentiment2")}
    answer = chat.choices[0].message.content
    assert answer and answer == predicted(instruct, "--input", str(conversation), "--max-new-tokens", "12")[0]["text"]
    assert streamed == answer
    assert text == predicted(instruct, "--input", "What is 2 plus 3?", "--max-new-tokens", "12")[0]["text"]
    for name, answer in labels.items():
        expected = [predicted(tmp_path / name, "--input", t)[0] for t in ("a warm, funny film", "a dull mess")]
        assert [r["label"] for r in answer["data"]] == [e["label"] for e in expected]
        assert [r["probability"] for r in answer["data"]] == pytest.approx([e["probability"] for e in expected],
                                                                          abs=2e-4)
