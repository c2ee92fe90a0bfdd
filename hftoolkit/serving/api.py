"""The OpenAI-compatible HTTP API (FastAPI): models, chat and text completions (streamed over server-sent events on
request), classifications in `predict`'s record shape, a reward model's scores of answers, and health.

Every refusal is a 4xx in the OpenAI error shape, {"error": {"message", "type", "param", "code"}}, and leaves the
server answering. Completions use the run's own chat template and eval.generation settings, with the request's
max_tokens, temperature and top_p over them.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Annotated

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from hftoolkit.config import tasks
from hftoolkit.serving.batcher import Batcher, Work
from hftoolkit.serving.limits import Limits
from hftoolkit.serving.registry import GENERATES, LABELS, SCORES, ServedRun


class Refused(Exception):
    """A request the server will not answer: its HTTP status and the OpenAI error's fields."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


class Turn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[dict]


class Generating(BaseModel):
    model_config = ConfigDict(extra="ignore")  # (clients send fields this server does not use, like user)
    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = 1
    stream: bool = False
    stop: str | list[str] | None = None


class ChatRequest(Generating):
    messages: list[Turn] = Field(min_length=1)


class CompletionRequest(Generating):
    prompt: str | list[str]


class ClassificationRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    input: str | list[str] | list[list[str]]


class Scored(BaseModel):
    """One answer to score, and the prompt it answers (a text, or the conversation's turns; empty: none)."""
    model_config = ConfigDict(extra="forbid")
    prompt: str | list[Turn] = ""
    answer: str | list[Turn]


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    input: Scored | Annotated[list[Scored], Field(min_length=1)]


def error_body(message: str, code: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def build_app(served: dict[str, ServedRun], batcher: Batcher, limits: Limits, api_key: str | None) -> FastAPI:
    app = FastAPI(title="hftoolkit", docs_url=None, redoc_url=None, openapi_url=None)
    jobs: dict[tuple, object] = {}  # (run, generation settings) -> the run's job with them
    _refusals(app, limits, api_key)

    @app.get("/health")
    async def health():
        return {"status": "ok", "models": len(served)}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": int(run.run.stat().st_mtime), "owned_by": "hftoolkit",
             "task": run.task, "family": run.job.model.family, "adapter": run.adapter is not None}
            for name, run in served.items()]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest):
        run = _text_run(served, body.model, chat=True)
        turns = [{"role": t.role, "content": _text(t.content)} for t in body.messages]
        _check_input(run, [_rendered(run, turns)], limits)
        return await _complete(run, turns, body, "chat.completion", batcher, limits, jobs)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        run = _text_run(served, body.model, chat=False)
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) != 1:
            raise Refused(400, "prompt: one prompt a request", "invalid_request", "prompt")
        _check_input(run, prompts, limits)
        return await _complete(run, prompts[0], body, "text_completion", batcher, limits, jobs)

    @app.post("/v1/classifications")
    async def classifications(body: ClassificationRequest):
        run = _run_of(served, body.model, LABELS)
        given = [body.input] if isinstance(body.input, str) else body.input
        inputs = _labelled_inputs(run, given)
        _check_input(run, [x if isinstance(x, str) else " ".join(x) for x in given], limits)
        records = await asyncio.wrap_future(batcher.submit(Work(run, inputs, run.job)))
        shown = [x if isinstance(x, str) else "\t".join(x) for x in given]  # (as predict shows a pair)
        return {"object": "list", "model": run.name,
                "data": [{"index": i, "input": x, **r} for i, (x, r) in enumerate(zip(shown, records))]}

    @app.post("/v1/scores")
    async def scores(body: ScoreRequest):
        run = _run_of(served, body.model, SCORES)
        given = [body.input] if isinstance(body.input, Scored) else body.input
        pairs = [(_turns_or_text(x.prompt), _turns_or_text(x.answer)) for x in given]
        _check_input(run, [_plain(p) + "\n" + _plain(a) for p, a in pairs], limits)
        records = await asyncio.wrap_future(batcher.submit(Work(run, pairs, run.job)))
        return {"object": "list", "model": run.name,
                "data": [{"index": i, "score": r["score"]} for i, r in enumerate(records)]}

    return app


def _turns_or_text(value):
    return value if isinstance(value, str) else [{"role": t.role, "content": _text(t.content)} for t in value]


def _plain(value) -> str:
    return value if isinstance(value, str) else "\n".join(t["content"] for t in value)


def _refusals(app: FastAPI, limits: Limits, api_key: str | None) -> None:
    """Every refusal in the OpenAI error shape: the key, the body's size, bad JSON or fields, unknown paths, and a
    failure while answering (a 500; the server goes on)."""
    @app.exception_handler(Refused)
    async def refused(request: Request, err: Refused):
        return JSONResponse(error_body(err.message, err.code, err.param), status_code=err.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException):
        message = f"{request.method} {request.url.path}: {err.detail}"
        return JSONResponse(error_body(message, "not_found" if err.status_code == 404 else "invalid_request"),
                            status_code=err.status_code)

    @app.exception_handler(Exception)
    async def failed(request: Request, err: Exception):  # (the request fails, the server does not)
        return JSONResponse(error_body(f"{type(err).__name__}: {str(err)[:300]}", "server_error",
                                       kind="server_error"), status_code=500)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, err: RequestValidationError):
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        message = "the body is not valid JSON" if first.get("type") == "json_invalid" else \
            f"{where}: {first.get('msg', 'invalid')}"
        return JSONResponse(error_body(message, "invalid_request", where), status_code=400)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1/") \
                and request.headers.get("authorization", "") != f"Bearer {api_key}":
            return JSONResponse(error_body("a missing or wrong API key: send Authorization: Bearer <the key in "
                                           "HFTOOLKIT_API_KEY>", "invalid_api_key", kind="authentication_error"),
                                status_code=401)
        length = request.headers.get("content-length")
        if request.method == "POST" and not (length or "").isdigit():  # (a body of unknown size is not read)
            return JSONResponse(error_body("a request body needs its Content-Length", "length_required"),
                                status_code=411)
        if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
            return JSONResponse(error_body(f"the body holds {length} bytes, over this server's limit of "
                                           f"{limits.max_body_bytes}", "body_too_large"), status_code=413)
        return await call_next(request)


def _labelled_inputs(run: ServedRun, given: list) -> list:
    """The inputs as the run's formulation reads them, as predict parses its lines: a text, its words (tagging),
    or a (text, text_pair) pair for a run trained on sentence pairs."""
    pairs = bool(run.job.recipe.data.text_pair_column)
    if not given or any(isinstance(x, str) == pairs or (not isinstance(x, str) and len(x) != 2) for x in given):
        shape = "[text, text_pair] pairs" if pairs else "texts"
        raise Refused(400, f"input: model {run.name} reads {shape}: send one, or a list of them", "invalid_request",
                      "input")
    if pairs:
        return [tuple(x) for x in given]
    return [x.split() for x in given] if run.task == tasks.TAGGING else list(given)


def _find(served: dict[str, ServedRun], name: str) -> ServedRun:
    if name not in served:
        raise Refused(404, f"model {name!r} is not served here; these are: {', '.join(served)}",
                      "model_not_found", "model")
    return served[name]


# What a run of each kind answers, and the endpoint it answers at.
ANSWERS = {GENERATES: ("writes text", "/v1/completions"), LABELS: ("labels its inputs", "/v1/classifications"),
           SCORES: ("scores answers and writes none", "/v1/scores")}


def _run_of(served: dict[str, ServedRun], name: str, kind: str) -> ServedRun:
    """The run served as `name`, refused with the endpoint that answers it where it is not of `kind`."""
    run = _find(served, name)
    if run.kind != kind:
        what, endpoint = ANSWERS[run.kind]
        raise Refused(400, f"model {run.name} is a {run.task} run, which {what}: POST to {endpoint}",
                      "wrong_endpoint", "model")
    return run


def _text_run(served: dict[str, ServedRun], name: str, chat: bool) -> ServedRun:
    run = _run_of(served, name, GENERATES)
    if chat and not run.chats:
        raise Refused(400, f"model {run.name} is a {run.task} run, which continues text and reads no "
                           "conversation: use /v1/completions", "wrong_endpoint", "model")
    return run


def _text(content) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if any(part.get("type") != "text" for part in content):
        raise Refused(400, "messages: only text content is read", "invalid_request", "messages")
    return "".join(part.get("text", "") for part in content)


def _rendered(run: ServedRun, turns: list[dict]) -> str:
    from hftoolkit.sources.conversations import render

    return render(run.base.counter, turns, add_generation_prompt=True)


def _check_input(run: ServedRun, texts: list[str], limits: Limits) -> None:
    longest = max(_tokens(run, text) for text in texts)
    if longest > limits.max_input_tokens:
        raise Refused(400, f"the input is {longest} tokens, over this server's limit of "
                           f"{limits.max_input_tokens}", "context_length_exceeded", "messages")


def _request_job(run: ServedRun, body: Generating, limits: Limits, jobs: dict):
    """The run's job with the request's generation settings over its eval.generation; one validation per set."""
    import dataclasses

    from hftoolkit.config.recipe import replaced

    if body.n != 1:
        raise Refused(400, "n: this server writes one choice a request", "invalid_request", "n")
    asked = body.max_completion_tokens or body.max_tokens
    if asked is not None and asked > limits.max_tokens:
        raise Refused(400, f"max_tokens: {asked} is over this server's limit of {limits.max_tokens}",
                      "invalid_request", "max_tokens")
    values = {}
    if asked is not None:
        values["eval.generation.max_new_tokens"] = asked
    if body.temperature is not None:
        values["eval.generation.strategy"] = "greedy" if body.temperature == 0 else "sample"
        if body.temperature > 0:
            values["eval.generation.temperature"] = body.temperature
    if body.top_p is not None:
        values["eval.generation.top_p"] = body.top_p
    key = (run.name, tuple(sorted(values.items())))
    if key not in jobs:
        jobs[key] = dataclasses.replace(run.job, recipe=replaced(run.job.recipe, values, "the request")) \
            if values else run.job
    return jobs[key]


async def _complete(run: ServedRun, given, body: Generating, kind: str, batcher: Batcher, limits: Limits,
                    jobs: dict):
    job = _request_job(run, body, limits, jobs)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    ident = f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    if body.stream:
        return StreamingResponse(_streamed(run, given, job, kind, ident, stops, batcher),
                                 media_type="text/event-stream")
    records = await asyncio.wrap_future(batcher.submit(Work(run, [given], job)))
    text, stopped = _cut(records[0]["text"], stops)
    written = _tokens(run, text)
    finish = "stop" if stopped or written < job.max_new_tokens else "length"
    choice = {"index": 0, "finish_reason": finish}
    choice.update({"message": {"role": "assistant", "content": text}} if kind == "chat.completion"
                  else {"text": text, "logprobs": None})
    prompt = _tokens(run, _rendered(run, given) if isinstance(given, list) else given)
    return {"id": ident, "object": kind, "created": int(time.time()), "model": run.name, "choices": [choice],
            "usage": {"prompt_tokens": prompt, "completion_tokens": written, "total_tokens": prompt + written}}


async def _streamed(run: ServedRun, given, job, kind: str, ident: str, stops: list[str], batcher: Batcher):
    """Server-sent events: a chunk per piece of text as the model writes it, the finish reason, then [DONE]."""
    from transformers import TextIteratorStreamer

    streamer = TextIteratorStreamer(run.base.processor, skip_prompt=True, skip_special_tokens=True)
    future = batcher.submit(Work(run, [given], job, streamer))
    chunk_kind = "chat.completion.chunk" if kind == "chat.completion" else "text_completion"

    def event(delta: str | None, finish: str | None = None, role: bool = False) -> str:
        if kind == "chat.completion":
            choice = {"index": 0, "delta": ({"role": "assistant"} if role else {})
                      | ({"content": delta} if delta else {}), "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
        return "data: " + json.dumps({"id": ident, "object": chunk_kind, "created": int(time.time()),
                                      "model": run.name, "choices": [choice]}) + "\n\n"

    if kind == "chat.completion":
        yield event(None, role=True)
    written, pieces, stopped = "", iter(streamer), False
    strips = run.task != tasks.CLM  # (the formulations strip their answers; clm continues the text as written)
    while (piece := await asyncio.to_thread(next, pieces, None)) is not None:
        if not written and strips:
            piece = piece.lstrip()
        text, stopped = _cut(written + piece, stops)
        if text[len(written):]:
            yield event(text[len(written):])
        written = text
        if stopped:
            break
    try:
        await asyncio.wrap_future(future)
        finish = "stop" if stopped or _tokens(run, written) < job.max_new_tokens else "length"
    except Exception as err:  # (after the stream began, an error is the last event)
        yield "data: " + json.dumps(error_body(str(err)[:300], "generation_failed", kind="server_error")) + "\n\n"
        return
    yield event(None, finish)
    yield "data: [DONE]\n\n"


def _cut(text: str, stops: list[str]) -> tuple[str, bool]:
    """`text` up to the first of the stop strings, and whether one was found."""
    ends = [text.find(s) for s in stops if s and s in text]
    return (text[:min(ends)], True) if ends else (text, False)


def _tokens(run: ServedRun, text: str) -> int:
    return len(run.base.counter(text, add_special_tokens=False)["input_ids"]) if text else 0
