"""An OpenAI-compatible server for agentjax models (launch/serve.py): app factory and batcher."""

from agentjax.serve.app import BodyLimitMiddleware, ClientError, ServerThread, create_app
from agentjax.serve.batcher import Batcher, Overloaded, SamplingKey

__all__ = ["Batcher", "BodyLimitMiddleware", "ClientError", "Overloaded", "SamplingKey",
           "ServerThread", "create_app"]
