"""An OpenAI-compatible HTTP API over a Completer (FastAPI): what launch/serve.py runs.

    app = create_app(Completer.from_hf(folder), model_name="qwen-judge")
    uvicorn.run(app, host="127.0.0.1", port=8001)

  POST /v1/chat/completions  {"model", "messages": [{"role", "content"}], "max_tokens" (or
                             "max_completion_tokens"), "temperature", "top_p", "stop", "seed", "n",
                             and vLLM's extras "repetition_penalty" (transformers' definition)
                             and "max_think_tokens" (a thinking budget), as the official
                             Co-ReAct client sends them}
  POST /v1/completions       {"model", "prompt": str | [str] | [int] | [[int]], the same settings}
  GET  /v1/models            the one served model (its id is `model_name`)
  GET  /health               {"status": "ok", "model", batcher counters (requests, batches, rows,
                             pending, rejected)}; never refused for overload

Responses have OpenAI's shapes (id, object, created, model, choices, usage). Handlers validate
and tokenize on the event loop (the tokenizer is used by that one thread only: the Completer
decodes text from its own byte table), then wait on a Batcher (agentjax/serve/batcher.py), whose
thread alone runs the model: concurrent requests with equal sampling settings share one
`Completer.complete` decode batch.

Every error is a JSON body {"error": {"message", "type", "param", "code"}} and never stops the
server:
  400  malformed JSON, a field of the wrong type or out of range (the message names the field),
       stream=true and other unsupported options, max_tokens above --max_tokens_limit, a prompt
       that leaves no room in the context (or whose prompt + max_tokens exceed it);
  404  an unknown model name or path;  405  a wrong method;
  413  a body above max_request_bytes (by its Content-Length, or counted while reading it);
  500  the model failed on this request (the worker goes on with the others);
  503  overloaded: max_pending requests are already waiting or decoding; answered at once with a
       Retry-After header (seconds, retry_after_s), code "overloaded". Only a request that passed
       every check above is counted, from its submission to the batcher until it is answered (or
       its client goes away): refused bodies never hold a place.
Defaults follow OpenAI's: temperature 1, top_p 1, n 1; without max_tokens a completion runs to
max_tokens_limit or to the end of the context, whichever comes first. Sampled (temperature > 0)
outputs depend on the batch they were decoded in, so a seed makes a request reproducible only
when it is decoded alone; greedy outputs do not depend on the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Annotated, Any, Union

import fastapi
import pydantic
import pydantic_core
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentjax.sampling.complete import PromptError
from agentjax.serve.batcher import Batcher, Overloaded, SamplingKey

_INT64 = 2**63


class ClientError(Exception):
  """A request's own mistake, answered with `status` and this message."""

  def __init__(self, message: str, status: int = 400, param: str | None = None,
               type: str = "invalid_request_error", code: str | None = None,  # noqa: A002
               headers: dict[str, str] | None = None):
    super().__init__(message)
    self.message, self.status, self.param, self.type, self.code = message, status, param, type, code
    self.headers = headers  # of the answer (a 503's Retry-After)


def error_body(message: str, type: str, param: str | None = None,  # noqa: A002
               code: str | None = None) -> dict[str, Any]:
  return {"error": {"message": message, "type": type, "param": param, "code": code}}


# ============================================================================ request bodies


class _Body(pydantic.BaseModel):
  # Fields this server does not know are ignored (clients send many optional ones); the ones
  # that would change the answer and are not supported are refused in _check_unsupported.
  model_config = pydantic.ConfigDict(extra="ignore")


def _one_of(description: str) -> pydantic.WrapValidator:
  """A union field's error in one line ("prompt: must be a string or ..."), instead of one
  line per branch the union tried."""

  def check(value: Any, handler: Any) -> Any:
    try:
      return handler(value)
    except pydantic.ValidationError:
      raise pydantic_core.PydanticCustomError("union_type", f"must be {description}") from None

  return pydantic.WrapValidator(check)


class TextPart(_Body):
  type: str
  text: str | None = None


class ChatMessage(_Body):
  role: str
  content: Annotated[Union[str, list[TextPart], None],
                     _one_of("a string or a list of text parts ({'type': 'text', 'text': ...})")
                     ] = None


class _Sampling(_Body):
  model: str
  max_tokens: int | None = pydantic.Field(None, ge=1)
  temperature: float | None = pydantic.Field(None, ge=0.0, le=2.0)
  top_p: float | None = pydantic.Field(None, gt=0.0, le=1.0)
  repetition_penalty: float | None = pydantic.Field(None, gt=0.0, le=10.0)
  max_think_tokens: int | None = pydantic.Field(None, ge=0)
  n: int | None = pydantic.Field(None, ge=1)
  stop: Annotated[Union[str, list[str], None], _one_of("a string or a list of strings")] = None
  seed: int | None = pydantic.Field(None, ge=-_INT64, lt=_INT64)
  stream: bool | None = None
  logprobs: Any = None
  best_of: int | None = None


class ChatRequest(_Sampling):
  messages: list[ChatMessage] = pydantic.Field(min_length=1)
  max_completion_tokens: int | None = pydantic.Field(None, ge=1)
  top_logprobs: int | None = None
  tools: list[Any] | None = None


class CompletionRequest(_Sampling):
  # Strings, or token ids (one prompt of ids, or a list of them), as OpenAI's API takes them.
  prompt: Annotated[Union[str, list[str], list[int], list[list[int]]],
                    _one_of("a string, a list of strings, a list of token ids or a list of "
                            "token-id lists")]
  echo: bool | None = None
  suffix: str | None = None


# ============================================================================ the app


def create_app(completer: Any, *, model_name: str, max_batch: int = 8,
               batch_window_s: float = 0.01, max_tokens_limit: int = 1024,
               max_request_bytes: int = 1 << 20, max_stop: int = 16, max_pending: int = 256,
               retry_after_s: int = 1) -> fastapi.FastAPI:
  """The FastAPI app serving `completer` (a Completer, or any object with its methods:
  chat_ids, encode, complete, and the attributes max_total_tokens and cfg.vocab_size).

  Args:
    model_name: the model's id in /v1/models; requests naming another model get 404.
    max_batch: most prompts in one complete() call.
    batch_window_s: how long the batch worker waits for more requests after the first.
    max_tokens_limit: largest max_tokens a request may ask for (and the default).
    max_request_bytes: largest request body (413 above it).
    max_stop: most stop strings in one request.
    max_pending: the most requests waiting or decoding (the batcher's bound); one more is answered
      503 at once. 256 is 16 batches of launch/serve.py's --max_batch 16: a judge's concurrent
      calls (judge.max_concurrency, 64 by default) fit four times over, a request admitted last
      waits at most 16 decode batches, and the prompts held are at most 256 bodies of
      max_request_bytes. Keep it at least max_batch: batches are made of the pending requests.
    retry_after_s: the Retry-After of a 503, whole seconds (HTTP's unit).
  Returns:
    The app; app.state.batcher is its Batcher (stats() counts batches and rows), closed when the
    app shuts down (the lifespan, which uvicorn runs).
  """
  if max_tokens_limit < 1:
    raise ValueError(f"max_tokens_limit must be >= 1, got {max_tokens_limit}")
  if max_request_bytes < 1:
    raise ValueError(f"max_request_bytes must be >= 1, got {max_request_bytes}")
  if isinstance(retry_after_s, bool) or not isinstance(retry_after_s, int) or retry_after_s < 0:
    raise ValueError(f"retry_after_s must be an integer >= 0 (seconds), got {retry_after_s!r}")
  batcher = Batcher(completer, max_batch=max_batch, window_s=batch_window_s,
                    max_pending=max_pending)
  context = int(completer.max_total_tokens)
  vocab = int(completer.cfg.vocab_size)
  created = int(time.time())

  @contextlib.asynccontextmanager
  async def lifespan(_):
    yield
    batcher.close()

  app = fastapi.FastAPI(title="agentjax OpenAI-compatible server", lifespan=lifespan,
                        docs_url=None, redoc_url=None)
  app.state.batcher, app.state.completer, app.state.model_name = batcher, completer, model_name
  app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes)
  _add_error_handlers(app)

  # ---------------------------------------------------------------- validation shared by both

  def check_model(req: _Sampling) -> None:
    if req.model != model_name:
      raise ClientError(f"The model {req.model!r} does not exist; this server serves "
                        f"{model_name!r}", status=404, param="model", code="model_not_found")

  def check_unsupported(req: _Sampling, max_n: int, refused: tuple[str, ...] = ()) -> None:
    """Refuses what this server does not do; `refused`: the endpoint's own such fields."""
    for name in refused:
      if getattr(req, name):
        raise ClientError(f"{name} is not supported by this server", param=name)
    if req.stream:
      raise ClientError("streaming is not supported by this server (stream=true); send the "
                        "request without stream", param="stream")
    if req.logprobs not in (None, False, 0):
      raise ClientError("logprobs are not supported by this server", param="logprobs")
    if req.best_of not in (None, 1):
      raise ClientError("best_of is not supported by this server (only 1)", param="best_of")
    n = req.n or 1
    if n > max_n:
      raise ClientError(f"n={n} is above this server's limit {max_n} (its batch size "
                        f"--max_batch)", param="n")

  def sampling_key(req: _Sampling, max_tokens: int | None, field: str) -> SamplingKey:
    if max_tokens is not None and max_tokens > max_tokens_limit:
      raise ClientError(f"{field}={max_tokens} is above this server's limit {max_tokens_limit} "
                        f"(--max_tokens_limit)", param=field)
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stop) > max_stop:
      raise ClientError(f"stop has {len(stop)} strings; at most {max_stop} are allowed",
                        param="stop")
    if any(not s for s in stop):
      raise ClientError("stop strings must be non-empty", param="stop")
    temperature = 1.0 if req.temperature is None else float(req.temperature)
    top_p = 1.0 if req.top_p is None else float(req.top_p)
    if temperature == 0:  # greedy: top_p and the seed change nothing, so any greedy requests
      top_p, seed = 1.0, 0  # with the same length and stops share a batch
    else:
      seed = req.seed
    # Without max_tokens: the server's limit; rows also stop where the context ends ("length").
    return SamplingKey(max_new_tokens=max_tokens or max_tokens_limit, temperature=temperature,
                       top_p=top_p, stop=tuple(dict.fromkeys(stop)), seed=seed,
                       repetition_penalty=float(req.repetition_penalty or 1.0),
                       max_think_tokens=int(req.max_think_tokens or 0))

  def check_fit(prompts: list[list[int]], max_tokens: int | None, field: str, param: str) -> None:
    for i, ids in enumerate(prompts):
      where = f"{param}[{i}]" if len(prompts) > 1 else param
      if not ids:
        raise ClientError(f"{where} is empty (0 tokens)", param=param)
      if any(t < 0 or t >= vocab for t in ids):
        raise ClientError(f"{where} holds a token id outside the vocabulary [0, {vocab})",
                          param=param)
      if len(ids) >= context:
        raise ClientError(
            f"This model's maximum context length is {context} tokens (--max_total_tokens), "
            f"prompt and completion together; {where} has {len(ids)} tokens, which leaves no "
            f"room for a completion. Shorten the prompt.", param=param,
            code="context_length_exceeded")
      if max_tokens is not None and len(ids) + max_tokens > context:
        raise ClientError(
            f"This model's maximum context length is {context} tokens (--max_total_tokens); "
            f"{where} has {len(ids)} tokens and {field} asks for {max_tokens} more "
            f"({len(ids) + max_tokens} in all). Shorten the prompt or lower {field}.",
            param=field, code="context_length_exceeded")

  async def run(prompts: list[list[int]], key: SamplingKey) -> list[Any]:
    # Awaiting (not blocking) the worker's future: other requests are taken meanwhile. A client
    # that goes away cancels the future, and the worker drops the job if it has not started.
    try:
      future = batcher.submit(prompts, key)
    except Overloaded as e:
      raise ClientError(f"the server is overloaded: {e}; retry after {retry_after_s} s",
                        status=503, type="server_error", code="overloaded",
                        headers={"Retry-After": str(retry_after_s)}) from e
    try:
      return await asyncio.wrap_future(future)
    except PromptError as e:  # the completer's own checks of a request's prompts or settings
      raise ClientError(f"the model refused the request: {e}") from e
    except Exception as e:  # noqa: BLE001  this request failed; the worker goes on
      raise ClientError(f"the model failed on this request: {type(e).__name__}: {e}",
                        status=500, type="server_error") from e

  def usage(prompts: list[list[int]], outs: list[Any]) -> dict[str, int]:
    prompt = sum(len(p) for p in prompts)  # once per prompt, whatever n (as OpenAI counts)
    completion = sum(len(o.token_ids) for o in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}

  # ---------------------------------------------------------------- endpoints

  @app.post("/v1/chat/completions")
  async def chat_completions(req: ChatRequest) -> dict[str, Any]:
    check_model(req)
    check_unsupported(req, batcher.max_batch, refused=("top_logprobs", "tools"))
    if req.max_tokens is not None and req.max_completion_tokens is not None and \
        req.max_tokens != req.max_completion_tokens:
      raise ClientError("max_tokens and max_completion_tokens disagree; give one",
                        param="max_completion_tokens")
    field = "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"
    max_tokens = req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens
    key = sampling_key(req, max_tokens, field)
    messages = []
    for i, m in enumerate(req.messages):
      if isinstance(m.content, list):
        parts = []
        for j, part in enumerate(m.content):
          if part.type != "text" or part.text is None:
            raise ClientError(f"messages[{i}].content[{j}]: only text parts are supported "
                              f"(type 'text' with a 'text' field), got type {part.type!r}",
                              param=f"messages[{i}].content")
          parts.append(part.text)
        content = "".join(parts)
      else:
        content = m.content or ""
      messages.append({"role": m.role, "content": content})
    try:
      ids = completer.chat_ids(messages)
    except Exception as e:  # noqa: BLE001  a template may refuse a conversation (roles, order)
      raise ClientError(f"messages: the chat template failed: {type(e).__name__}: {e}",
                        param="messages") from e
    n = req.n or 1
    check_fit([ids], max_tokens, field, "messages")
    outs = await run([ids] * n, key)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": model_name,
            "choices": [{"index": j, "message": {"role": "assistant", "content": o.text},
                         "logprobs": None, "finish_reason": o.finish_reason}
                        for j, o in enumerate(outs)],
            "usage": usage([ids], outs)}

  @app.post("/v1/completions")
  async def completions(req: CompletionRequest) -> dict[str, Any]:
    check_model(req)
    check_unsupported(req, batcher.max_batch, refused=("echo", "suffix"))
    key = sampling_key(req, req.max_tokens, "max_tokens")
    p = req.prompt
    if isinstance(p, str):
      texts: list[Any] = [p]
    elif not p:
      raise ClientError("prompt is an empty list", param="prompt")
    elif all(isinstance(x, int) for x in p):
      texts = [list(p)]
    else:
      texts = list(p)
    n = req.n or 1
    if len(texts) * n > batcher.max_batch:
      raise ClientError(f"{len(texts)} prompts x n={n} completions is above this server's "
                        f"limit {batcher.max_batch} per request (--max_batch)", param="prompt")
    prompts = [completer.encode(t) if isinstance(t, str) else list(t) for t in texts]
    check_fit(prompts, req.max_tokens, "max_tokens", "prompt")
    outs = await run([ids for ids in prompts for _ in range(n)], key)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": model_name,
            "choices": [{"index": j, "text": o.text, "logprobs": None,
                         "finish_reason": o.finish_reason} for j, o in enumerate(outs)],
            "usage": usage(prompts, outs)}

  @app.get("/v1/models")
  async def models() -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                        "owned_by": "agentjax", "max_model_len": context}]}

  @app.get("/health")
  async def health() -> JSONResponse:
    ok = batcher.alive
    return JSONResponse({"status": "ok" if ok else "batch worker stopped", "model": model_name,
                         **batcher.stats()}, status_code=200 if ok else 503)

  return app


# ============================================================================ errors


def _field_name(loc: tuple[Any, ...]) -> str:
  """("body", "messages", 0, "content") -> "messages[0].content"."""
  name = ""
  for part in loc[1:] if loc and loc[0] == "body" else loc:
    if isinstance(part, int):
      name += f"[{part}]"
    else:
      name += f".{part}" if name else str(part)
  return name or "body"


def _add_error_handlers(app: fastapi.FastAPI) -> None:

  @app.exception_handler(ClientError)
  async def client_error(_, e: ClientError) -> JSONResponse:
    return JSONResponse(error_body(e.message, e.type, e.param, e.code), status_code=e.status,
                        headers=e.headers)

  @app.exception_handler(RequestValidationError)
  async def validation_error(_, e: RequestValidationError) -> JSONResponse:
    problems, param = [], None
    for err in e.errors():
      if err.get("type") == "json_invalid":
        ctx = err.get("ctx") or {}
        return JSONResponse(error_body(
            f"the request body is not valid JSON: {ctx.get('error', err.get('msg'))}",
            "invalid_request_error"), status_code=400)
      field = _field_name(tuple(err.get("loc", ())))
      param = param or field
      problems.append(f"{field}: {err.get('msg')}")
    message = "invalid request: " + "; ".join(problems) if problems else "invalid request body"
    return JSONResponse(error_body(message, "invalid_request_error", param), status_code=400)

  @app.exception_handler(StarletteHTTPException)
  async def http_error(_, e: StarletteHTTPException) -> JSONResponse:
    return JSONResponse(error_body(str(e.detail), "invalid_request_error"),
                        status_code=e.status_code)

  @app.exception_handler(Exception)
  async def server_error(_, e: Exception) -> JSONResponse:
    return JSONResponse(error_body(f"internal error: {type(e).__name__}: {e}", "server_error"),
                        status_code=500)


# ============================================================================ body size


class BodyLimitMiddleware:
  """Refuses request bodies above `max_bytes` with 413, before the app parses anything.

  The announced Content-Length is checked before any byte is read; a body sent without one
  (chunked) or longer than announced is counted while it is read and cut off at the limit. The
  body read here is handed to the app unchanged.
  """

  def __init__(self, app: Any, max_bytes: int):
    self.app, self.max_bytes = app, max_bytes

  async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
      await self.app(scope, receive, send)
      return
    lengths = [v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"]
    for value in lengths:
      if not value.isdigit():
        await self._refuse(scope, receive, send, 400, f"Content-Length {value!r} is not a number")
        return
      # More digits than any limit can have: too large, without converting it.
      if len(value) > 18 or int(value) > self.max_bytes:
        await self._refuse(scope, receive, send, 413, self._too_large(value.decode()))
        return
    body, more = bytearray(), True
    while more:
      message = await receive()
      if message["type"] == "http.disconnect":
        return  # the client went away; nobody to answer
      body += message.get("body", b"")
      if len(body) > self.max_bytes:
        await self._refuse(scope, receive, send, 413, self._too_large(f"more than {len(body)}"))
        return
      more = message.get("more_body", False)
    sent = False

    async def replay() -> dict[str, Any]:
      nonlocal sent
      if not sent:
        sent = True
        return {"type": "http.request", "body": bytes(body), "more_body": False}
      return await receive()

    await self.app(scope, replay, send)

  def _too_large(self, size: str) -> str:
    return (f"the request body ({size} bytes) is above this server's limit of {self.max_bytes} "
            f"bytes (--max_request_bytes)")

  @staticmethod
  async def _refuse(scope, receive, send, status: int, message: str) -> None:
    # Connection: close: the unread rest of the body cannot be told from a next request.
    response = JSONResponse(error_body(message, "invalid_request_error"), status_code=status,
                            headers={"Connection": "close"})
    await response(scope, receive, send)



# ============================================================================ loading


def recorded_config(workdir: str) -> Any:
  """The config a training run recorded in {workdir}/config.json (what it trained with), as a
  ConfigDict (agentjax/train/upgrade.py's recorded_config: upgraded, the extras dropped);
  ValueError naming the file when it is absent or cannot be read."""
  import os

  from agentjax.train.upgrade import RECORD, RecordError
  from agentjax.train.upgrade import recorded_config as read_record
  config = read_record(workdir)
  if config is None:
    raise RecordError(f"{os.path.join(workdir, RECORD)}: no such file; serve a run's workdir "
                      f"(its checkpointer writes it) or give the run's config")
  return config


def completer_from_run(config: Any, workdir: str, *, step: int | None = None,
                       max_total_tokens: int = 4096) -> tuple[Any, str]:
  """(Completer, checkpoint directory) of a training run's checkpoint (the latest unless `step`).

  The run's policy is restored as launch/eval.py restores it (trainer.restore_policy, on the
  config's model and mesh).
  """
  from agentjax.parallel import make_mesh
  from agentjax.sampling.complete import Completer
  from agentjax.train import config as config_lib
  from agentjax.train.trainer import restore_policy

  config = config.copy_and_resolve_references()
  config_lib.validate(config)
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
  cfg, params, tokenizer, source = restore_policy(config, workdir, mesh, step=step,
                                                  purpose="serve")
  return Completer(cfg, params, tokenizer, max_total_tokens=max_total_tokens, mesh=mesh), source


# ============================================================================ in-process serving


class ServerThread:
  """An app served by uvicorn in a daemon thread (tests, and a judge server beside a trainer).

      server = ServerThread(create_app(completer, model_name="judge"))   # a free loopback port
      openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
      server.stop()
  """

  def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
               start_timeout_s: float = 60.0):
    import socket
    import threading

    import uvicorn

    self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    self._sock.bind((host, port))
    self.port = self._sock.getsockname()[1]
    self.url = f"http://{host}:{self.port}"
    self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                    name="agentjax-serve", daemon=True)
    self._thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not self._server.started:
      if not self._thread.is_alive() or time.monotonic() > deadline:
        self.stop()
        raise RuntimeError(f"the server at {self.url} did not start within {start_timeout_s} s")
      time.sleep(0.02)

  def stop(self, timeout_s: float = 30.0) -> None:
    """Shuts the server down (its lifespan closes the app's batcher) and frees the port."""
    self._server.should_exit = True
    self._thread.join(timeout_s)
    self._sock.close()

  def __enter__(self) -> "ServerThread":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.stop()
