"""`hftoolkit serve` on a reward run: POST /v1/scores answers the scores predict gives, and the run is not served as
a chat or completion model."""

from __future__ import annotations

import pytest

from tests.helpers import RECIPES, needs, train_recipe
from tests.helpers.serving import QUICK, predicted, serving

pytestmark = needs("fastapi")


@pytest.mark.slow
def test_a_reward_run_scores_answers_as_predict_does_and_refuses_chat(tmp_path):
    import httpx

    train_recipe(RECIPES / "encoder-reward.yaml", tmp_path / "judge", *QUICK)
    expected = predicted(tmp_path / "judge", "--input", "What is 2 plus 3?\\t2 plus 3 is 5.")[0]["score"]
    with serving([("judge", tmp_path / "judge")]) as (url, _, _):
        body = {"model": "judge", "input": [{"prompt": "What is 2 plus 3?", "answer": "2 plus 3 is 5."},
                                            {"answer": "I don't know."}]}
        answer = httpx.post(f"{url}/v1/scores", json=body, timeout=60)
        chat = httpx.post(f"{url}/v1/chat/completions", timeout=60,
                          json={"model": "judge", "messages": [{"role": "user", "content": "hi"}]})
        labels = httpx.post(f"{url}/v1/classifications", json={"model": "judge", "input": "hi"}, timeout=60)
    assert answer.status_code == 200 and [row["index"] for row in answer.json()["data"]] == [0, 1]
    assert answer.json()["data"][0]["score"] == pytest.approx(expected, abs=1e-5)
    assert chat.status_code == labels.status_code == 400
    assert chat.json()["error"]["code"] == "wrong_endpoint" and "/v1/scores" in chat.json()["error"]["message"]
    assert "/v1/scores" in labels.json()["error"]["message"]
