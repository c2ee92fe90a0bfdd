"""base/secrets.py: the one rule for secrets in what hftoolkit writes or shows. What it masks, what it leaves alone
(a tokenizer's vocabulary, counts of tokens), the environment's secrets, YAML that still loads, and its cost on a
file of megabytes. Where it is applied: tests/e2e/test_security.py."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from hftoolkit.base.secrets import redact

HF = "hf_" + "aB3" * 10
OPENAI = "sk-proj-" + "x9Y_" * 6

MASKED = [  # (text, as written)
    # a URL's password, any scheme; the user kept
    ("--storage postgresql://me:s3cret@db.example:5432/studies", "--storage postgresql://me:***@db.example:5432/studies"),
    ("mysql+pymysql://u:p@ss@h/d?charset=utf8", "mysql+pymysql://u:***@h/d?charset=utf8"),
    ("redis://:pw123@h:6379/0", "redis://:***@h:6379/0"),
    ('{"storage": "postgresql+psycopg://me:s3cret@h/db"}', '{"storage": "postgresql+psycopg://me:***@h/db"}'),
    # a URL whose userinfo is a token alone
    ("git clone https://ghp_abcdefghijklmnopqrstuvwxyz0123@github.com/o/r.git",
     "git clone https://***@github.com/o/r.git"),
    # token shapes, anywhere
    (f"loaded with {HF}.", "loaded with ***."),
    (f"Authorization: Bearer {HF}", "Authorization: Bearer ***"),
    (f"key={OPENAI}&x=1", "key=***&x=1"),
    (f'"{OPENAI}"', '"***"'),
    # a credential-named option
    ("hftoolkit train r.yaml --hub-token abc123 -v", "hftoolkit train r.yaml --hub-token *** -v"),
    ("hftoolkit push run --hub-token=abc123", "hftoolkit push run --hub-token=***"),
    ("x --api-key K1 --password 'p w' --client-secret \"s t\"",
     "x --api-key *** --password '***' --client-secret \"***\""),
    ("--TOKEN abc --apikey def", "--TOKEN *** --apikey ***"),
    # key=value
    ("hftoolkit train r.yaml --set push.token=abc123", "hftoolkit train r.yaml --set push.token=***"),
    ("HF_TOKEN=abc123 OPENAI_API_KEY='k k' WANDB_API_KEY=w1 hftoolkit",
     "HF_TOKEN=*** OPENAI_API_KEY='***' WANDB_API_KEY=*** hftoolkit"),
    ("https://h/data.csv?token=abc&x=1", "https://h/data.csv?token=***&x=1"),
    ("access_key=AK1 private-key=PK2 my.auth_token=T3 passwd=12345678",
     "access_key=*** private-key=*** my.auth_token=*** passwd=***"),
    ('"hftoolkit sweep r.yaml --set push.token=\\"a b\\" -v"',  # (a command line inside a JSON string)
     '"hftoolkit sweep r.yaml --set push.token=\\"***\\" -v"'),
    # "key": value (JSON, a Python dict)
    ('{"password": "pa\\"ss", "x": 1}', '{"password": "***", "x": 1}'),
    ('{"hub_token":"abc","secret": 1234}', '{"hub_token":"***","secret": "***"}'),  # (still JSON)
    ("{'client_secret': 'abc', 'accessToken': 'def', 'apiKey': 'ghi'}",
     "{'client_secret': '***', 'accessToken': '***', 'apiKey': '***'}"),
    # key: value at a line's start (YAML)
    ("password: hunter2\nx:\n  - api_key: abc # note\n  HF_TOKEN: 'q'\n",
     "password: ***\nx:\n  - api_key: ***\n  HF_TOKEN: '***'\n"),
]

SURVIVES = [  # a tokenizer's vocabulary, counts of tokens, prose, paths
    '{"pad_token": "<pad>", "eos_token": "</s>", "bos_token": "<s>", "unk_token": "[UNK]", "sep_token": "[SEP]", '
    '"cls_token": "[CLS]", "mask_token": "[MASK]", "additional_special_tokens": []}',
    "pad_token: <pad>\neos_token: </s>\nbos_token: <s>\nunk_token: <unk>\n",
    "Tokenizer(pad_token='[PAD]', eos_token='</s>', add_bos_token=true, padToken='<pad>')",
    "max_new_tokens=64 max_tokens: 512 max_input_tokens=2048 num_tokens=5 tokens=12 per_token=6",
    "max_new_tokens: 64\nmax_tokens: 512\nmax_input_tokens: 2048\ntoken: 17\n",
    '{"max_new_tokens": 20, "train_tokens_per_second": 812.5, "token": 17, "api_key": null, "secret": false}',
    "--max-new-tokens 64 --max-tokens=512 --token-file ~/.hf/token --tokens 3",
    "token_type_ids=[0, 0] tokenizer=bert tokenizers==0.21 token.json",
    "push: no Hugging Face token: set HF_TOKEN or run `hf auth login`, then push again",
    "the secret: practice. The token is a word piece; a password is asked once.",
    "sqlite:////tmp/sweeps/encoder-classification/study.db",
    "postgresql://me@127.0.0.1:5432/studies and postgresql://me:***@h/db",
    "git@github.com:org/repo.git, someone@example.com",
    "task-classification-with-a-rather-long-name, desk-research-and-development-notes",
    "hf_hub_download(repo_id='x'), use_hf_transfer, hf_token_path",
    "monkey=5 key=6 keys: [a, b]",
]


@pytest.mark.parametrize(("text", "written"), MASKED)
def test_a_secret_is_masked(text, written):
    assert redact(text) == written
    assert redact(written) == written  # (masking twice changes nothing)


@pytest.mark.parametrize("text", SURVIVES)
def test_what_is_no_secret_survives_unchanged(text):
    assert redact(text) == text


def test_an_environment_secret_is_masked_wherever_it_occurs(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "plainvalue123")
    monkeypatch.setenv("PGPASSWORD", 'p"ss w0rd é')
    monkeypatch.setenv("OPENAI_API_KEY", "key-4-the-api")
    monkeypatch.setenv("MY_SECRET", "short")  # (under 8 characters: too common a text to mask everywhere)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "falsefalse")  # (no secret: TOKEN is not its word)
    text = 'the row says plainvalue123; p"ss w0rd é; key-4-the-api. short falsefalse'
    assert redact(text) == "the row says ***; ***; ***. short falsefalse"
    assert redact(json.dumps({"text": text})) == json.dumps({"text": "the row says ***; ***; ***. short falsefalse"})
    monkeypatch.setenv("HF_TOKEN", "anothervalue9")  # (a variable set since is read again)
    assert redact("plainvalue123 anothervalue9") == "plainvalue123 ***"


def test_yaml_with_a_value_masked_whole_still_loads():
    text = (f"name: run\ndescription: {HF}\nitems:\n  - {HF}/x\n  - kept\nurl: postgresql://me:pw@h/db\n"
            f"long: a value that goes on\n  {HF} on its next line\n")
    written = redact(text, yaml=True)
    assert yaml.safe_load(written) == {"name": "run", "description": "***", "items": ["***/x", "kept"],
                                       "url": "postgresql://me:***@h/db",
                                       "long": "a value that goes on *** on its next line"}
    assert redact(written, yaml=True) == written


def test_five_megabytes_take_well_under_a_second():
    rows = [json.dumps({"input": f"review {i}: the acting was superb, every token of it", "label": "pos",
                        "prediction": "pos", "probability": 0.93, "password": "pw"}) for i in range(40_000)]
    predictions = "\n".join(rows).ljust(5_000_000)
    prose = ("per token: one word piece, the token: another, password: asked once " * 75_000)[:5_000_000]  # one line
    for text in (predictions, prose):
        started = time.perf_counter()
        written = redact(text)
        seconds = time.perf_counter() - started
        assert seconds < 3, f"{seconds:.2f} s for 5 MB"  # (measured 0.2 to 0.4 s; a scan gone quadratic takes minutes)
        assert written == (text.replace('"password": "pw"', '"password": "***"') if text is predictions else text)
