r"""An agentjax model behind the OpenAI API (chat and text completions), for any OpenAI client.

    python launch/serve.py --hf_path=models/Qwen2.5-0.5B-Instruct --port=8001
    python launch/serve.py --workdir=runs/demo/cw_grpo --port=8001      # a run's latest checkpoint
    curl -s 127.0.0.1:8001/v1/models
    curl -s 127.0.0.1:8001/v1/chat/completions -H 'Content-Type: application/json' -d \
        '{"model": "Qwen2.5-0.5B-Instruct", "messages": [{"role": "user", "content": "Hi"}],
          "max_tokens": 32, "temperature": 0}'

or from Python: openai.OpenAI(base_url="http://127.0.0.1:8001/v1", api_key="unused"). A run's
judge points at it with judge.backend=openai, judge.base_url=http://127.0.0.1:8001/v1 and
judge.model set to the served name.

--hf_path serves a Hugging Face folder (config.json, safetensors, tokenizer with a chat template
for chat requests); --workdir serves a training run's checkpoint (the latest, or --step), restored
as launch/eval.py restores it, with the config the run recorded (its config.json, with any
--config.* overrides on top) or --config. The model's name (/v1/models, and the
"model" every request must give) is --model_name, by default the folder's basename.

Concurrent requests are decoded together: a worker takes the requests that arrive within
--batch_window_ms of each other (up to --max_batch prompts) and runs those with equal sampling
settings as one decode batch; beyond --max_pending requests waiting or decoding, a request is
answered 503 with Retry-After at once. Binds 127.0.0.1 unless --host says otherwise. Endpoints,
status codes and limits: agentjax/serve/app.py.
"""

from __future__ import annotations

import os

from absl import app, flags

import common  # launch/common.py: the entry point, the run config

_HF_PATH = flags.DEFINE_string("hf_path", None, "A Hugging Face folder to serve.")
_WORKDIR = flags.DEFINE_string("workdir", None, "A run's workdir: serve its checkpoint (without "
                               "--config, its config.json, whose relative paths are the run's: "
                               "start from the folder the run started in).")
_CONFIG = common.define_config("The run's config file and preset (with --workdir; default: the "
                               "config the run recorded, its config.json).", required=False)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step of --workdir (default: the latest).")
_MODEL_NAME = flags.DEFINE_string("model_name", None, "The served model's name (default: the "
                                  "basename of --hf_path or --workdir).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0 exposes it to the "
                            "network).")
_PORT = flags.DEFINE_integer("port", 8001, "Port to bind.")
_MAX_TOTAL_TOKENS = flags.DEFINE_integer("max_total_tokens", 4096, "Context of a request: prompt "
                                         "and completion tokens together.")
_MAX_TOKENS_LIMIT = flags.DEFINE_integer("max_tokens_limit", 1024, "Largest max_tokens a request "
                                         "may ask for (also the default when it gives none).")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 16, "Most prompts decoded in one batch.")
_BATCH_WINDOW_MS = flags.DEFINE_float("batch_window_ms", 10.0, "How long the batch worker waits "
                                      "for more requests after the first one.")
_MAX_REQUEST_BYTES = flags.DEFINE_integer("max_request_bytes", 1 << 20, "Largest request body "
                                          "(413 above it).")
_MAX_PENDING = flags.DEFINE_integer("max_pending", 256, "Most requests waiting or decoding; one "
                                    "more is answered 503 with Retry-After at once (bounded "
                                    "memory and wait under a pile-up). 256: 16 batches of the "
                                    "default --max_batch, 4 judges' worth of concurrent calls "
                                    "(judge.max_concurrency 64).")
_RETRY_AFTER_S = flags.DEFINE_integer("retry_after_s", 1, "Retry-After of a 503, in whole "
                                      "seconds.")
_DTYPE = flags.DEFINE_string("dtype", None, "Parameter and compute dtype of --hf_path "
                             "(float32, bfloat16; default: float32).")


def main(_):
  if (_WORKDIR.value is None) == (_HF_PATH.value is None):
    raise app.UsageError("give exactly one of --hf_path or --workdir")
  if _WORKDIR.value is not None and _CONFIG.value is None:
    raise common.UserError(f"--workdir={_WORKDIR.value}: holds no recorded config "
                           f"({common.RECORD}); give the run's --config (e.g. "
                           f"configs/cw_grpo.py:demo)")
  import uvicorn

  from agentjax.sampling.complete import Completer
  from agentjax.serve.app import completer_from_run, create_app

  folder = os.path.abspath(os.path.expanduser(_HF_PATH.value or _WORKDIR.value)).rstrip("/")
  if _HF_PATH.value is not None:
    completer = Completer.from_hf(folder, max_total_tokens=_MAX_TOTAL_TOKENS.value,
                                  dtype=_DTYPE.value)
    source = folder
  else:
    _CONFIG.record()
    completer, source = completer_from_run(_CONFIG.value, folder, step=_STEP.value,
                                           max_total_tokens=_MAX_TOTAL_TOKENS.value)
  name = _MODEL_NAME.value or os.path.basename(folder)
  server_app = create_app(completer, model_name=name, max_batch=_MAX_BATCH.value,
                          batch_window_s=_BATCH_WINDOW_MS.value / 1000,
                          max_tokens_limit=_MAX_TOKENS_LIMIT.value,
                          max_request_bytes=_MAX_REQUEST_BYTES.value,
                          max_pending=_MAX_PENDING.value, retry_after_s=_RETRY_AFTER_S.value)
  print(f"serving {source} as {name!r} at http://{_HOST.value}:{_PORT.value}/v1", flush=True)
  uvicorn.run(server_app, host=_HOST.value, port=_PORT.value, log_level="info")


if __name__ == "__main__":
  common.run(main)
