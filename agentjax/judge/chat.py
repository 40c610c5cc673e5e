"""Chat backends: many conversations in, one reply text (or the reason there is none) each out.

    backend = build_chat(config.judge, mesh=mesh)          # judge.backend "openai" or "local"
    replies = backend.chat([[{"role": "user", "content": "..."}], ...])
    replies[i].text          # the reply of conversation i, or None with replies[i].error

What every LLM-backed caller shares: the CW-GRPO judges (agentjax/judge/openai_judge.py,
agentjax/judge/local.py) and Co-ReAct's rubric appliers and ranking judges
(agentjax/coreact/appliers.py, rankers.py). The caller builds the messages and parses the text;
the backend only gets the text back, and never raises on a fault of the server or the model.

"openai" (OpenAIChat): any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, a hosted
API, agentjax's launch/serve.py) through the official `openai` client. Every conversation of a
chat() batch is submitted at once to a thread pool of judge.max_concurrency workers over one
synchronous client. Threads rather than AsyncOpenAI with a semaphore because chat() is called
from synchronous loops (training, collection): a thread pool needs no event loop (asyncio.run
would fail under a caller's running loop, e.g. a notebook, and an async client's connections are
tied to the loop that opened them), the sync httpx client is thread-safe with one shared
connection pool, and the workers spend their time waiting on sockets with the GIL released.
The pool size is exactly the number of requests in flight. OpenAIText is the same client,
pool and retries over the text-completions endpoint (/v1/completions: a text prompt continued,
one sample per request; Co-ReAct's extra candidate generators, agentjax/coreact/branches.py).

Faults (OpenAIEndpoint.request, the one retry loop of both): the client's own retries are off
(max_retries=0) so that the retry count and backoff are ours (judge.max_retries attempts after
the first, sleeping retry_backoff_s * 2**i before retry i+1) and counted (ChatReply.retries).
Retried: timeouts, refused or dropped connections, and HTTP 408, 409, 429 and 5xx (the statuses
the openai client itself retries). Not retried: other HTTP statuses (400 for a prompt longer than
the model's context, 401, 404: asking again gets the same answer), and replies that arrive but
are unusable (not a chat completion, no choices, empty content), since at temperature 0 the
model would say the same again.

"local" (LocalChat): a Flax Qwen from a Hugging Face folder (judge.hf_path), greedy. Every
conversation of a chat() batch is decoded as ONE batch by agentjax.sampling.complete.Completer
(one prefill, one decode loop, each row stopping at its own EOS); judge.max_batch > 0 splits them
into chunks of at most that many (sorted by prompt length, so a chunk's rows pad to similar
lengths), to bound the KV cache. A prompt longer than judge.max_prompt_tokens fails alone; an
error of a decode fails that decode's conversations.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import time
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

log = logging.getLogger(__name__)

Messages = Sequence[dict[str, str]]

RETRIED_STATUSES = frozenset({408, 409, 429})  # and every status >= 500


def _retried(status: int) -> bool:
  return status in RETRIED_STATUSES or status >= 500


@dataclasses.dataclass(frozen=True)
class ChatReply:
  """One conversation's (or text completion's) reply.

  text: the reply text, or None when there is none (then `error` says why).
  error: why there is no usable reply (None when text is set).
  retries: attempts made after the first (openai).
  finish_reason: "stop" / "length" when the backend says (local: the Completer's), else None.
  completion_tokens: generated tokens, when the backend counts them (local), else 0.
  stop_reason: the stop string that ended a text completion, when the server names it (OpenAIText).
  """
  text: str | None
  error: str | None = None
  retries: int = 0
  finish_reason: str | None = None
  completion_tokens: int = 0
  stop_reason: str | None = None

  @property
  def ok(self) -> bool:
    return self.text is not None

  @classmethod
  def failed(cls, error: str, retries: int = 0) -> "ChatReply":
    return cls(None, error, retries)


@runtime_checkable
class ChatBackend(Protocol):
  """chat(conversations) -> one ChatReply per conversation, in order; never raises on a fault of
  the server or the model."""

  def chat(self, conversations: Sequence[Messages]) -> list[ChatReply]: ...

  def identity(self) -> dict[str, str]:
    """{"backend", "model"}."""
    ...


def short(text: Any, limit: int = 160) -> str:
  """Whitespace collapsed, cut to `limit` characters (for error messages)."""
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit] + "..."


# ---------------------------------------------------------------------------------------------
# openai
# ---------------------------------------------------------------------------------------------


def check_openai_config(cfg: Any, model: str | None = None) -> None:
  """Raises ValueError naming the first judge.* field the openai backend cannot run with."""
  if not isinstance(cfg.base_url, str) or not cfg.base_url.strip():
    raise ValueError(f"judge.base_url: an OpenAI-compatible endpoint is required, got "
                     f"{cfg.base_url!r}")
  model = cfg.model if model is None else model
  if not isinstance(model, str) or not model.strip():
    raise ValueError(f"judge.model: the served model's name is required, got {model!r}")
  checks = [("max_concurrency", cfg.max_concurrency >= 1, ">= 1"),
            ("timeout_s", cfg.timeout_s > 0, "> 0"),
            ("max_retries", cfg.max_retries >= 0, ">= 0"),
            ("retry_backoff_s", cfg.retry_backoff_s >= 0, ">= 0"),
            ("max_tokens", cfg.max_tokens >= 0, ">= 0 (0: not sent)"),
            ("temperature", cfg.temperature >= 0, ">= 0")]
  for name, ok, want in checks:
    if not ok:
      raise ValueError(f"judge.{name} must be {want}, got {getattr(cfg, name)!r}")


class OpenAIEndpoint:
  """The official client over config.judge's endpoint, with our retries and thread pool: what
  the chat (OpenAIChat) and text (OpenAIText) backends share (see the module docstring).

  Settings from config.judge: base_url, model (or the `model` argument: one endpoint serving
  several models), api_key_env, temperature, max_tokens (0: not sent), max_concurrency,
  timeout_s, max_retries, retry_backoff_s.
  """

  def __init__(self, judge_config: Any, model: str | None = None):
    import httpx
    import openai

    check_openai_config(judge_config, model)
    self.model = judge_config.model if model is None else model
    self.temperature = float(judge_config.temperature)
    self.max_tokens = int(judge_config.max_tokens)
    self.max_concurrency = int(judge_config.max_concurrency)
    self.timeout_s = float(judge_config.timeout_s)
    self.max_retries = int(judge_config.max_retries)
    self.retry_backoff_s = float(judge_config.retry_backoff_s)
    api_key = os.environ.get(judge_config.api_key_env, "") if judge_config.api_key_env else ""
    timeout = httpx.Timeout(self.timeout_s)  # connect, read, write and pool wait, each
    # Enough pooled connections that every worker keeps one alive between calls.
    limits = httpx.Limits(max_connections=max(1000, self.max_concurrency),
                          max_keepalive_connections=self.max_concurrency)
    self.client = openai.OpenAI(
        base_url=judge_config.base_url, api_key=api_key or "EMPTY", max_retries=0,
        timeout=timeout, http_client=openai.DefaultHttpxClient(timeout=timeout, limits=limits))

  def identity(self) -> dict[str, str]:
    return {"backend": "openai", "model": self.model}

  def close(self) -> None:
    self.client.close()

  def map(self, fn: Callable[[Any], ChatReply], items: Sequence[Any]) -> list[ChatReply]:
    """fn over items, all in flight together (up to max_concurrency), results in order."""
    if not items:
      return []
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=min(self.max_concurrency, len(items)), thread_name_prefix="openai") as pool:
      return list(pool.map(fn, items))

  def request(self, create: Callable[[], Any]) -> tuple[Any, str | None, int]:
    """create() (one request of the client) with our retries: (its response, None, retries) or
    (None, why there is none, retries). Never raises."""
    import openai

    error = "no attempt"
    attempts = 0
    while attempts <= self.max_retries:
      if attempts:
        time.sleep(self.retry_backoff_s * 2 ** (attempts - 1))
      attempts += 1
      try:
        return create(), None, attempts - 1
      except openai.APIStatusError as e:
        error = f"HTTP {e.status_code}: {short(e.message)}"
        if not _retried(e.status_code):
          break
      except openai.APITimeoutError:
        error = f"timed out after {self.timeout_s:g} s"
      except openai.APIConnectionError as e:
        error = f"connection failed: {short(str(e.__cause__ or e))}"
      except Exception as e:  # pylint: disable=broad-except
        # A 200 whose body is not JSON, or that the client cannot read: the server answered
        # something that is not a completion; asking again gets the same.
        return None, f"unreadable response: {type(e).__name__}: {short(str(e))}", attempts - 1
    return None, f"{error} ({attempts} attempt{'s' * (attempts > 1)})", attempts - 1


class OpenAIChat(OpenAIEndpoint):
  """An OpenAI-compatible chat-completions endpoint (see the module docstring), at
  judge.temperature and judge.max_tokens."""

  def chat(self, conversations: Sequence[Messages]) -> list[ChatReply]:
    """One reply per conversation, all in flight together (up to max_concurrency)."""
    return self.map(self.call, conversations)

  def call(self, messages: Messages) -> ChatReply:
    """The reply to one conversation, with our retries. Never raises."""
    # max_tokens 0 is not sent (the official CW-GRPO code sends none): the server's own limit
    # applies, and a reasoning model (gpt-oss) is not cut off in its reasoning.
    limit = {"max_tokens": self.max_tokens} if self.max_tokens else {}
    response, why, retries = self.request(lambda: self.client.chat.completions.create(
        model=self.model, messages=list(messages), temperature=self.temperature, **limit))
    if why is None:
      content, why = reply_text(response)
    return ChatReply.failed(why, retries) if why is not None else ChatReply(content,
                                                                            retries=retries)


@dataclasses.dataclass(frozen=True)
class TextRequest:
  """One text completion: a prompt continued with these sampling settings (OpenAIText)."""
  prompt: str
  max_tokens: int
  temperature: float
  top_p: float = 1.0
  stop: tuple[str, ...] = ()
  seed: int | None = None


class OpenAIText(OpenAIEndpoint):
  """An OpenAI-compatible text-completions endpoint (POST /v1/completions: vLLM, SGLang,
  agentjax's launch/serve.py): a text prompt continued, the server tokenizing it with its own
  tokenizer (Co-ReAct's extra candidate generators continue the policy's context text). Each
  request carries its own sampling settings (judge.temperature and judge.max_tokens are not
  used) and asks for one sample (n=1: servers bound n, and one seed per sample keeps samples
  distinct and reproducible); the retries and the thread pool are OpenAIEndpoint's."""

  def complete(self, requests: Sequence[TextRequest]) -> list[ChatReply]:
    """One reply per request, all in flight together (up to max_concurrency). A reply's text is
    the server's (cut before the stop string that ended it, which `stop_reason` names when the
    server says); finish_reason "stop" or "length". Never raises."""
    return self.map(self.call, requests)

  def call(self, req: TextRequest) -> ChatReply:
    seed = {} if req.seed is None else {"seed": int(req.seed)}
    stop = {"stop": list(req.stop)} if req.stop else {}
    response, why, retries = self.request(lambda: self.client.completions.create(
        model=self.model, prompt=req.prompt, max_tokens=int(req.max_tokens), n=1,
        temperature=float(req.temperature), top_p=float(req.top_p), **stop, **seed))
    if why is not None:
      return ChatReply.failed(why, retries)
    choice, why = completion_choice(response)
    if why is not None:
      return ChatReply.failed(why, retries)
    # vLLM names the stop that matched in `stop_reason` (a token id when it was one), SGLang in
    # `matched_stop`; OpenAI and agentjax's server do not say.
    matched = [getattr(choice, k, None) for k in ("stop_reason", "matched_stop")]
    finish = getattr(choice, "finish_reason", None)
    return ChatReply(choice.text, retries=retries,
                     finish_reason=finish if isinstance(finish, str) else None,
                     stop_reason=next((m for m in matched if isinstance(m, str)), None))


def completion_choice(response: Any) -> tuple[Any, str | None]:
  """(the first choice of a text completion, None) or (None, why there is none). Its text may be
  empty (a sample that ended at once is a sample)."""
  if isinstance(response, str):  # the client returns a non-JSON body as text
    return None, f"response is not a text completion: {short(response, 80)!r}"
  choices = getattr(response, "choices", None)
  if not isinstance(choices, list) or not choices:
    return None, "response has no choices"
  if not isinstance(getattr(choices[0], "text", None), str):
    return None, "response's choice has no text"
  return choices[0], None


def reply_text(response: Any) -> tuple[str, str | None]:
  """(the first choice's message content, None) or ("", why there is none). The client builds
  responses without validating them, so every field may be missing or of the wrong type."""
  if isinstance(response, str):  # the client returns a non-JSON body as text
    return "", f"response is not a chat completion: {short(response, 80)!r}"
  choices = getattr(response, "choices", None)
  if not isinstance(choices, list) or not choices:
    return "", "response has no choices"
  message = getattr(choices[0], "message", None)
  content = getattr(message, "content", None)
  if not isinstance(content, str) or not content.strip():
    finish = getattr(choices[0], "finish_reason", None)
    return "", f"empty reply (finish_reason={finish!r})"
  return content, None


# ---------------------------------------------------------------------------------------------
# local
# ---------------------------------------------------------------------------------------------


class LocalChat:
  """Greedy replies of a local Completer, batched (see the module docstring)."""

  def __init__(self, completer: Any, *, max_prompt_tokens: int, max_new_tokens: int,
               max_batch: int = 0, model_name: str = "local"):
    if max_prompt_tokens < 1 or max_new_tokens < 1:
      raise ValueError(f"judge.max_prompt_tokens ({max_prompt_tokens}) and judge.max_new_tokens "
                       f"({max_new_tokens}) must be >= 1")
    if max_batch < 0:
      raise ValueError(f"judge.max_batch must be >= 0 (0: one batch), got {max_batch}")
    if completer.max_total_tokens < max_prompt_tokens + 1:
      raise ValueError(f"the Completer's max_total_tokens ({completer.max_total_tokens}) leaves no "
                       f"room to reply to a prompt of judge.max_prompt_tokens={max_prompt_tokens}")
    self.completer, self.model_name = completer, model_name
    self.max_prompt_tokens, self.max_new_tokens = int(max_prompt_tokens), int(max_new_tokens)
    self.max_batch = int(max_batch)

  @classmethod
  def from_config(cls, judge_config: Any, mesh: Any = None) -> "LocalChat":
    """judge.hf_path loaded on `mesh` (every process, one SPMD decode), with judge.max_*."""
    from agentjax.sampling.complete import Completer

    path = judge_config.hf_path
    if not path or not os.path.isdir(os.path.expanduser(path)):
      raise ValueError(f"judge.hf_path: the local backend needs a Hugging Face folder, got "
                       f"{path!r}")
    max_prompt, max_new = int(judge_config.max_prompt_tokens), int(judge_config.max_new_tokens)
    if max_prompt < 1 or max_new < 1:  # before loading anything
      raise ValueError(f"judge.max_prompt_tokens ({max_prompt}) and judge.max_new_tokens "
                       f"({max_new}) must be >= 1")
    completer = Completer.from_hf(os.path.expanduser(path), max_total_tokens=max_prompt + max_new,
                                  mesh=mesh)
    return cls(completer, max_prompt_tokens=max_prompt, max_new_tokens=max_new,
               max_batch=int(judge_config.max_batch),
               model_name=os.path.basename(os.path.normpath(path)))

  def identity(self) -> dict[str, str]:
    return {"backend": "local", "model": self.model_name}

  def chat(self, conversations: Sequence[Messages]) -> list[ChatReply]:
    """One reply per conversation, decoded together (in max_batch chunks)."""
    out: list[ChatReply | None] = [None] * len(conversations)
    jobs, prompts = [], []
    for j, messages in enumerate(conversations):
      ids = self.completer.chat_ids(messages)
      if len(ids) > self.max_prompt_tokens:
        out[j] = ChatReply.failed(f"prompt of {len(ids)} tokens exceeds "
                                  f"judge.max_prompt_tokens={self.max_prompt_tokens}")
      else:
        jobs.append(j)
        prompts.append(ids)
    order = list(range(len(jobs)))
    size = len(jobs)
    if self.max_batch and len(jobs) > self.max_batch:
      order.sort(key=lambda i: len(prompts[i]))
      size = self.max_batch
    for lo in range(0, len(order), max(size, 1)):
      chunk = order[lo:lo + size]
      for i, reply in zip(chunk, self._decode([prompts[i] for i in chunk])):
        out[jobs[i]] = reply
    return out  # type: ignore[return-value]

  def _decode(self, prompts: list[list[int]]) -> list[ChatReply]:
    """The reply of each prompt, all in one Completer call (greedy)."""
    try:
      completions = self.completer.complete(prompts, max_new_tokens=self.max_new_tokens)
    except Exception as e:  # noqa: BLE001 - a decode fault (device OOM, ...) fails its prompts
      log.exception("local chat: the decode of %d prompts failed", len(prompts))
      return [ChatReply.failed(f"local decode failed: {type(e).__name__}: {e}")] * len(prompts)
    return [ChatReply(c.text, finish_reason=c.finish_reason, completion_tokens=len(c.token_ids))
            for c in completions]


CHAT_BACKENDS = ("openai", "local")


def build_chat(judge_config: Any, mesh: Any = None, *, backend: str | None = None,
               model: str | None = None) -> Any:
  """A chat backend over config.judge's endpoint or local model.

  backend: "openai" or "local" (default: judge_config.backend; Co-ReAct's appliers and rankers
    name theirs in config.coreact and only borrow config.judge's connection settings).
  model: for "openai", the served model to ask instead of judge.model (several judges behind one
    endpoint); must be None for "local" (its model is judge.hf_path).
  """
  name = judge_config.backend if backend is None else backend
  if name == "openai":
    return OpenAIChat(judge_config, model=model)
  if name == "local":
    if model is not None:
      raise ValueError(f"the local chat backend serves judge.hf_path; a model name ({model!r}) "
                       f"only selects among an openai endpoint's models")
    return LocalChat.from_config(judge_config, mesh=mesh)
  raise ValueError(f"{name!r} is not a chat backend; choose one of {list(CHAT_BACKENDS)}")
