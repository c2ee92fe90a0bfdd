"""`hftoolkit serve` answering decoders through transformers' continuous batching (hftoolkit/serving/continuous.py).

What a client notices: the same greedy answers as the static path gives (and predict), fp32 and bf16, adapter and
merged runs; a lone request answered without waiting out --max-wait-ms; streaming, stop strings and max_tokens as
before; prompts that begin alike prefilled once for that beginning, with the same answers; and adapters of one base
still mixed in one static batch. Servers run in this process
(tests/helpers/serving.py's `serving`); the static path is had by switching continuous batching off for a server.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from unittest import mock

import pytest

from tests.helpers import RECIPES, needs, run_cli, train_recipe
from tests.helpers.serving import QUICK, gathered, predicted, serving

pytestmark = needs("fastapi", "httpx")


def _post(*args, **kwargs):
    import httpx

    return httpx.post(*args, **kwargs)

QUESTIONS = ["What is 2 plus 3?", "Name a colour.", "Reverse the words: a b c", "hello there",
             "Translate cat to French", "Is the film good?", "Count to three", "Say hi"]


@pytest.fixture(scope="module")
def decoder_runs(tmp_path_factory):
    """A tiny GPT-2 tuned on pairs (it answers chats) twice with LoRA, once in bf16, and the first merged."""
    root = tmp_path_factory.mktemp("continuous")
    for seed in (1, 2):
        train_recipe(RECIPES / "decoder-preference.yaml", root / f"chat{seed}", *QUICK, f"training.seed={seed}")
    train_recipe(RECIPES / "decoder-preference.yaml", root / "bf16", *QUICK, "model.dtype=bfloat16")
    run_cli("merge", root / "chat1", "--output", root / "merged")
    return root


@contextmanager
def static_path_only():
    """Servers started inside answer every request as they did before continuous batching."""
    with mock.patch("hftoolkit.serving.batcher.answers_continuously", lambda run, job: False):
        yield


def chat(url: str, model: str, question: str, **settings) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": question}], "temperature": 0, **settings}
    answer = _post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def complete(url: str, model: str, prompt: str, **settings) -> dict:
    body = {"model": model, "prompt": prompt, "temperature": 0, **settings}
    answer = _post(f"{url}/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()


def concurrently(url: str, requests: list[tuple[str, str]], **settings) -> list[dict]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda r: chat(url, r[0], r[1], **settings), requests))


@pytest.mark.slow
@pytest.mark.parametrize("run", ["chat1", "merged"])
def test_greedy_answers_through_continuous_batching_are_the_static_path_s(decoder_runs, run):
    requests = [("model", q) for q in QUESTIONS]
    with serving([("model", decoder_runs / run)]) as (url, served, batcher):
        continuous = concurrently(url, requests, max_tokens=24)
        text = complete(url, "model", QUESTIONS[0], max_tokens=24)["choices"][0]["text"]
        assert batcher.answered_continuously == len(requests) + 1, "continuous batching answered them"
    with static_path_only(), serving([("model", decoder_runs / run)]) as (url, _, batcher):
        static = concurrently(url, requests, max_tokens=24)
        assert batcher.answered_continuously == 0
    assert [a["choices"] for a in continuous] == [a["choices"] for a in static]
    assert [a["usage"] for a in continuous] == [a["usage"] for a in static]
    if run == "chat1":  # (and predict writes the same)
        assert text == predicted(decoder_runs / run, "--input", QUESTIONS[0], "--max-new-tokens", "24")[0]["text"]


@pytest.mark.slow
def test_a_bf16_run_answers_through_continuous_batching_as_the_static_path_does(decoder_runs):
    """One request at a time, the same greedy tokens. (Concurrent rows are exact in fp32 only: in bf16 the attention
    over a packed batch sums in another order, so a near tie may break otherwise, as the static path's own padding
    may.)"""
    with serving([("model", decoder_runs / "bf16")]) as (url, served, batcher):
        assert str(served["model"].base.model.dtype) == "torch.bfloat16"
        alone = [chat(url, "model", q, max_tokens=24)["choices"] for q in QUESTIONS[:4]]
        together = concurrently(url, [("model", q) for q in QUESTIONS], max_tokens=24)
        assert batcher.answered_continuously == 4 + len(QUESTIONS)
    with static_path_only(), serving([("model", decoder_runs / "bf16")]) as (url, _, batcher):
        static = [chat(url, "model", q, max_tokens=24)["choices"] for q in QUESTIONS[:4]]
    assert alone == static
    assert all(a["choices"][0]["finish_reason"] in ("stop", "length") for a in together)


@pytest.mark.slow
def test_a_lone_request_does_not_wait_out_max_wait(decoder_runs):
    """With a 30 s window, a request on a quiet server (greedy through continuous batching, sampled through a static
    batch, one after the other) is answered in much less."""
    with serving([("chat", decoder_runs / "chat1")], max_wait=30) as (url, _, batcher):
        started = time.monotonic()
        greedy = chat(url, "chat", QUESTIONS[0], max_tokens=8)
        sampled = [chat(url, "chat", QUESTIONS[0], max_tokens=8, temperature=1.0) for _ in range(2)]
        took = time.monotonic() - started
        assert batcher.answered_continuously == 1 and batcher.batches == 2
    assert took < 20, f"three requests took {took:.0f} s: one waited out the 30 s window"
    assert greedy["choices"][0]["message"]["content"] is not None
    texts = [s["choices"][0]["message"]["content"] for s in sampled]
    assert texts[0] and texts[0] == texts[1], "a sampled answer is seeded, so the same each time"


@pytest.mark.slow
def test_sampled_answers_stay_seeded_while_continuous_batching_writes_others(decoder_runs):
    with serving([("chat", decoder_runs / "chat1")]) as (url, _, batcher):
        alone = chat(url, "chat", QUESTIONS[1], max_tokens=16, temperature=1.0)["choices"][0]
        with ThreadPoolExecutor(8) as pool:  # (one sampled request at a time: a batch of them samples otherwise)
            greedy = [pool.submit(chat, url, "chat", q, max_tokens=48) for q in QUESTIONS[2:]]
            sampled = [chat(url, "chat", QUESTIONS[1], max_tokens=16, temperature=1.0)["choices"][0]
                       for _ in range(2)]
            assert all(f.result()["choices"][0]["finish_reason"] for f in greedy)
        assert sampled == [alone, alone]
        assert batcher.answered_continuously == len(greedy)


@pytest.mark.slow
def test_adapters_of_one_base_are_still_mixed_in_one_batch_as_predict_answers(decoder_runs):
    pairs = [("first", decoder_runs / "chat1"), ("second", decoder_runs / "chat2")]
    requests = [(name, q) for q in QUESTIONS[:4] for name, _ in pairs]  # (interleaved: any batch of two mixes)
    with serving(pairs, max_wait=1.0) as (url, served, batcher):
        assert served["first"].base is served["second"].base
        with gathered(batcher, requests=len(requests)):
            answers = concurrently(url, requests, max_tokens=12)
        assert batcher.most_adapters == 2 and batcher.answered_continuously == 0
        texts = {name: complete(url, name, QUESTIONS[0], max_tokens=12)["choices"][0]["text"] for name, _ in pairs}
    for name, run in pairs:
        assert texts[name] == predicted(run, "--input", QUESTIONS[0], "--max-new-tokens", "12")[0]["text"], name
    assert answers[0]["choices"] != answers[1]["choices"], "each adapter answers with its own weights"


@pytest.mark.slow
def test_streaming_stop_strings_and_max_tokens_through_continuous_batching(decoder_runs):
    question = QUESTIONS[0]
    with serving([("chat", decoder_runs / "chat1")]) as (url, _, batcher):
        whole = chat(url, "chat", question, max_tokens=24)
        text = whole["choices"][0]["message"]["content"]
        stop = text[len(text) // 2:len(text) // 2 + 2]
        cut = chat(url, "chat", question, max_tokens=24, stop=stop)["choices"][0]
        body = {"model": "chat", "messages": [{"role": "user", "content": question}], "temperature": 0,
                "max_tokens": 24, "stream": True}
        events = [(settings, _post(f"{url}/v1/chat/completions", json={**body, **settings}, timeout=120).text)
                  for settings in ({}, {"stop": stop})]
        assert batcher.answered_continuously == 4
    assert whole["choices"][0]["finish_reason"] == "length"  # (a random model: it writes no eos in 24 tokens)
    assert cut == {"index": 0, "finish_reason": "stop",
                   "message": {"role": "assistant", "content": text[:text.index(stop)]}}
    for settings, stream in events:
        chunks = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
        pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"][0]["delta"].get("content")]
        assert stream.rstrip().endswith("data: [DONE]")
        if settings:
            assert "".join(pieces) == cut["message"]["content"] and chunks[-1]["choices"][0]["finish_reason"] == "stop"
        else:
            assert "".join(pieces) == text and chunks[-1]["choices"][0]["finish_reason"] == "length"
            assert len(pieces) > 1, "the answer came in pieces as it was written"


@pytest.mark.slow
def test_prompts_that_begin_alike_share_their_first_pages_and_answer_as_the_static_path_does(decoder_runs):
    """The pages of a beginning several prompts share (a system prompt, an instruction) are prefilled once: later
    requests start past it. What each request skipped is read where transformers' scheduler asks the cache."""
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    from hftoolkit.serving.continuous import PAGE_TOKENS

    shared = "Answer briefly, in plain words: "  # (with a question, within the run's 64-token prompts)
    requests = [("model", shared + q) for q in QUESTIONS[:4]]
    search = PagedAttentionCache.search_prefix_match
    skipped = []

    def spied(cache, request_id, prompt_ids):
        skipped.append(search(cache, request_id, prompt_ids))
        return skipped[-1]

    with mock.patch.object(PagedAttentionCache, "search_prefix_match", spied), \
            serving([("model", decoder_runs / "chat1")]) as (url, _, batcher):
        first = chat(url, "model", requests[0][1], max_tokens=12)
        later = concurrently(url, requests[1:], max_tokens=12)
        assert batcher.answered_continuously == len(requests)
    with static_path_only(), serving([("model", decoder_runs / "chat1")]) as (url, _, _):
        static = [chat(url, "model", q, max_tokens=12) for _, q in requests]
    assert skipped[0] == 0 and len(skipped) == len(requests)
    assert all(s >= PAGE_TOKENS and s % PAGE_TOKENS == 0 for s in skipped[1:]), skipped
    assert [a["choices"] for a in [first, *later]] == [a["choices"] for a in static]
