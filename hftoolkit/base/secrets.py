"""The one rule for secrets in what hftoolkit writes or shows: `redact(text)` masks them as `***`, wherever they came
from (a command line, a URL, a recipe, a library's log line, an error). Applied where files are written
(runs/rundir.write_text_atomic and RunDirectory's writes, the run lock's record, train.log's sink, a search worker's
log) and where the toolkit's lines are printed (console); never to what is run: a relaunched process or a search
worker gets the real command line and the real storage URL.

Masked:
- a URL's password, `scheme://user:password@host` -> `scheme://user:***@host` (any scheme), and a URL whose userinfo
  is a token alone (`https://TOKEN@host`, 20 characters or more);
- Hugging Face tokens (`hf_` and 20+ letters or digits) and OpenAI-style keys (`sk-` and 20+ characters);
- the value of an option or key whose name ends in a credential's word (token, password, passwd, secret, api_key,
  api-key, apikey, access_key, private_key; any case and prefix: hub_token, HF_TOKEN, client_secret, accessToken):
  `--hub-token X`, `--hub-token=X`, `--set push.token=X`, `HF_TOKEN=X`, `?token=X`, `"password": "x"` (JSON, a
  Python dict), `password: x` (YAML: the key at a line's start). Not a tokenizer's vocabulary (pad_token,
  eos_token, ...), counts of tokens (max_new_tokens, `token=5`), nor null, true or false;
- every occurrence of the value of an environment variable whose name says it holds a secret (TOKEN, PASSWORD,
  PASSWD, SECRET, API_KEY, APIKEY, ACCESS_KEY, PRIVATE_KEY: HF_TOKEN, OPENAI_API_KEY, WANDB_API_KEY, PGPASSWORD),
  8 characters or more.

Light: the standard library only. Each pattern starts at a literal or a line's start, and none reads a character
more than a bounded number of times: a 5 MB predictions file takes some 0.2 s.
"""

from __future__ import annotations

import json
import os
import re

MASK = "***"

# A URL's userinfo: the password runs to the last @ before the host (an unencoded @ in it hides none of it).
_URL_PASSWORD = re.compile(r"://(?P<user>[^\s:/@\"'<>]*):[^\s/\"'<>]+@")
_URL_TOKEN = re.compile(r"://[A-Za-z0-9_\-]{20,}@")
_TOKENS = re.compile(r"(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,})")

# A credential's name: a key whose last word is one of these (in lower, upper or capitalised case), in three forms,
# each found by a pattern that starts at a literal or a line's start, so that prose (`every token of it`) costs
# nothing: `--hub-token X`; `KEY=X` and `"KEY": X`, the key read back from its word; `KEY: X` at a line's start.
_WORDS = "|".join(form for word in ("token", "password", "passwd", "secret", "key")
                  for form in (word, word.upper(), word.capitalize()))
MAX_KEY = 100  # a key's characters before its word
_KEY = rf"(?=[A-Za-z0-9])(?P<key>[A-Za-z0-9_.\-]{{0,{MAX_KEY}}}?(?:{_WORDS}))(?![\w.\-])"
_OPTION = re.compile(rf"--{_KEY}[ \t]+")
_ASSIGNED = re.compile(rf"(?:{_WORDS})(?![\w.\-])(?P<sep>(?P<close>[\"'])[ \t]*:[ \t]*|=)")
_YAML_KEY = re.compile(rf"^[ \t]*(?:-[ \t]+)?{_KEY}:[ \t]+", re.M)
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_KEY_WORD = re.compile(r"(?:token|passw(?:or)?d|secret|(?:api|access|private)[_\-]?key)$", re.I)
# Names that end in `token` and name a tokenizer's vocabulary or a place in a sequence, not a credential.
_VOCABULARY = re.compile(r"(?:pad|eos|bos|unk|sep|cls|mask|start|end|image|video|audio|boi|eoi|special|next|per"
                         r"|last|first)[_\-]?token$", re.I)
# A value in quotes, or in quotes escaped as a JSON string writes them (a command line's `--set 'k="v w"'`).
_QUOTED = r"\\\"(?:[^\"\\\n]|\\[^\"\n])*\\\"|\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'"
_VALUES = {  # the value each form takes, quoted or bare
    "option": re.compile(rf"{_QUOTED}|(?!-)(?:[^\s\"'\\]|\\.)+"),  # --hub-token X
    "assignment": re.compile(rf"{_QUOTED}|(?:[^\s\"'&,;\\]|\\.)+"),  # --hub-token=X, HF_TOKEN=X, ?token=X
    "json": re.compile(rf"{_QUOTED}|(?![{{\[])[^\s,}}\]]+"),  # "password": "x"
    "yaml": re.compile(rf"{_QUOTED}|[^\s{{\[&*|>!#][^\n]*"),  # password: x
}
_NOT_A_SECRET = re.compile(r"null|none|true|false|~|\*\*\*|", re.I)
_NUMBER = re.compile(r"[+\-]?\d+(?:\.\d*)?(?:e[+\-]?\d+)?", re.I)

# An environment variable that holds a secret, by its name (TOKENIZERS_PARALLELISM does not).
_SECRET_VARIABLE = re.compile(r"(?:TOKEN|PASSWORD|PASSWD|SECRET|API_?KEY|ACCESS_KEY|PRIVATE_KEY)(?![A-Z])", re.I)
SECRET_VALUE_LENGTH = 8
# In YAML a plain value may not start with `*` (an alias): a value masked whole, after `KEY: ` or a list's `- `, is
# quoted (a long value's next lines, which may, are left alone).
_YAML_MASKED = re.compile(r"^(?P<head>[ \t]*(?:-[ \t]+|(?:-[ \t]+)?[^\s#'\"][^\n]*?:[ \t]+))"
                          r"(?P<value>\*\*\*[^\n]*?)[ \t]*$", re.M)


def redact(text: str, yaml: bool = False) -> str:
    """`text` with every secret the rule finds masked as `***` (the module's docstring says what it finds).
    yaml: the text is a YAML document, and a value masked whole is quoted, so that it still parses."""
    for value in _environment_secrets():
        if value in text:
            text = text.replace(value, MASK)
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: f"://{m['user']}:{MASK}@", text)
        text = _URL_TOKEN.sub(f"://{MASK}@", text)
    text = _TOKENS.sub(lambda m: m[0] if _glued(m.string, m.start()) else MASK, text)
    text = _mask_credentials(text)
    if yaml and MASK in text:
        text = _YAML_MASKED.sub(lambda m: m["head"] + "'" + m["value"].replace("'", "''") + "'", text)
    return text


def _glued(text: str, start: int) -> bool:
    """Whether a token-shaped match is the tail of a longer word (`task-...` holds `sk-`)."""
    return start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_")


def _mask_credentials(text: str) -> str:
    for pattern in (_OPTION, _ASSIGNED, _YAML_KEY):
        pieces, done = [], 0
        for match in pattern.finditer(text):
            found = _masked_value(text, match) if match.start() >= done else None
            if found is not None:
                start, end, masked = found
                pieces += [text[done:start], masked]
                done = end
        if pieces:
            text = "".join([*pieces, text[done:]])
    return text


def _masked_value(text: str, match: re.Match) -> tuple[int, int, str] | None:
    """Where the credential's value lies (inside its quotes) and what replaces it, or None: not a credential, or
    not in a key's form. A bare JSON value (a number) is replaced by a string, so that the JSON still loads."""
    if match.re is _ASSIGNED:
        start = match.start()
        while start and text[start - 1] in _KEY_CHARS and match.start() - start < MAX_KEY:
            start -= 1
        key = text[start:match.start("sep")]
        name = key.lstrip("-")
        if match["close"]:
            form = "json" if key == name and start and text[start - 1] == match["close"] else None
        else:
            form = "assignment" if key == name else "option" if len(key) - len(name) == 2 else None
    elif match.re is _YAML_KEY:
        name, form = match["key"], "yaml"
    else:  # --KEY X: an option of its own, not the tail of a word
        before = text[match.start() - 1:match.start()]
        name, form = match["key"], None if before and (before in "_-" or before.isalnum()) else "option"
    if form is None or not name[:1].isalnum() or not _KEY_WORD.search(name) or _VOCABULARY.search(name):
        return None
    value = _VALUES[form].match(text, match.end())
    if value is None:
        return None
    begin, end = value.span()
    quote = 2 if text.startswith('\\"', begin) else 1 if text[begin] in "\"'" else 0
    begin, end = begin + quote, end - quote
    inner = text[begin:end].strip()
    if _NOT_A_SECRET.fullmatch(inner) or (_NUMBER.fullmatch(inner) and name.lower().endswith("token")):
        return None
    return begin, end, f'"{MASK}"' if form == "json" and not quote else MASK


def _environment_secrets() -> list[str]:
    """The values of this process's secret-named environment variables, longest first, each also as JSON writes
    it inside a string (a value with a quote, a backslash or a non-ASCII character). A variable set since the last
    call counts: the environment is compared with the one last read, as CPython holds it (a microsecond; reading
    os.environ decodes every variable, some fifty microseconds, and train.log's sink asks at every line)."""
    global _read
    raw = getattr(os.environ, "_data", None)
    if raw is not None and raw == _read[0]:
        return _read[1]
    values = {v for k, v in os.environ.items() if len(v) >= SECRET_VALUE_LENGTH and _SECRET_VARIABLE.search(k)}
    values |= {json.dumps(v)[1:-1] for v in values}
    found = sorted(values, key=len, reverse=True)
    _read = (dict(raw) if raw is not None else None, found)
    return found


_read: tuple[dict | None, list[str]] = (None, [])
