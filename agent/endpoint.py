"""An OpenAI-compatible chat-completions endpoint in front of the rollout engine, recording every
token, so that an agent scaffold (mini-swe-agent, OpenHands, anything that calls a model through
an OpenAI base URL) can be trained as it is deployed.

    endpoint = ChatEndpoint(engine, tokenizer).start()        # http://127.0.0.1:<port>/v1
    with endpoint.rollout(instance_id=..., max_tokens=...) as rec:
        scaffold(base_url=endpoint.url, api_key=rec.key)       # its requests are this rollout's
    traj = rec.finish()                                        # token in, token out

Each rollout has a key, given to its scaffold as its API key (`Authorization: Bearer <key>`) or
sent as the `X-Rollout-Id` header; a request without a known key is refused (401). For every
request the endpoint renders the conversation with the model's chat template (and the request's
tools), samples with the engine inside the rollout's engine session (a router keeps its turns on
one replica), and records the ids it sampled from, the ids sampled, their logprobs and the policy
version of each; `agent.recorder` assembles them into one trajectory and counts the turns a
scaffold re-sent differently. Tool calls in the reply are parsed by the project's parser for the
model's family into OpenAI's `tool_calls`; tool results come back as `role: tool` messages and
are rendered by the chat template.

Sampling is the rollout's: temperature and top-p are those the learner's logprobs assume (a
request's own are ignored), `max_tokens` in a request can only shorten a reply. Served with
FastAPI under uvicorn on a thread of its own; requests run on a thread pool (the engine's
`generate` blocks; up to `max_concurrency` threads, made as needed), so many rollouts are
served at once and their requests reach the engine together, to be batched.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from starlette.requests import Request  # at module level: FastAPI resolves the handler's annotation here

from agent.engines.base import Engine, session
from agent.recorder import BadRequest, ContextFull, Recorder

log = logging.getLogger(__name__)

MODEL_NAME = "policy"  # what /v1/models lists; a request may name any model


class ChatEndpoint:
    def __init__(self, engine: Engine, tokenizer, family: str = "hermes", host: str = "127.0.0.1",
                 port: int = 0, model_name: str = MODEL_NAME, max_concurrency: int = 1024):
        self.engine, self.tokenizer, self.family = engine, tokenizer, family
        self.host, self.port, self.model_name = host, port, model_name
        self.stop_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        self._rollouts: dict[str, Recorder] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="endpoint")
        self._server = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL a scaffold is given (OpenAI's `base_url` / litellm's `api_base`)."""
        return f"http://{self.host}:{self.port}/v1"

    # -- rollouts ----------------------------------------------------------------------------
    def open(self, key: str | None = None, **settings) -> Recorder:
        """Register a rollout; its requests carry `key` (a fresh one if None). `settings`: the
        Recorder's fields (instance_id, max_tokens, max_new_tokens, temperature, top_p, seed)."""
        rec = Recorder(key or f"rollout-{uuid.uuid4().hex}", self.tokenizer, self.family, **settings)
        with self._lock:
            if rec.key in self._rollouts:
                raise ValueError(f"rollout key {rec.key!r} is already open")
            self._rollouts[rec.key] = rec
        return rec

    def close_rollout(self, key: str) -> Recorder | None:
        """Unregister a rollout: later requests with its key are refused."""
        with self._lock:
            return self._rollouts.pop(key, None)

    @contextlib.contextmanager
    def rollout(self, key: str | None = None, **settings):
        rec = self.open(key, **settings)
        try:
            yield rec
        finally:
            self.close_rollout(rec.key)

    # -- serving ------------------------------------------------------------------------------
    def complete(self, key: str, body: dict) -> dict:
        """One chat completion for rollout `key` (the HTTP handler's work, callable directly)."""
        with self._lock:
            rec = self._rollouts.get(key)
        if rec is None:
            raise PermissionError(f"no open rollout has the key {key[:24]!r}")
        if body.get("n") not in (None, 1):
            raise BadRequest("n: only 1 completion per request is served (one rollout, one sample)")
        requested = body.get("max_completion_tokens") or body.get("max_tokens")
        if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or requested < 1):
            raise BadRequest(f"max_tokens: {requested!r} is not a whole number of at least 1")
        t0 = time.monotonic()
        with rec.lock:
            ids = rec.prepare(body.get("messages"), body.get("tools") or None)
            sampling = rec.sampling(requested, self.stop_id)
            version = self.engine.version
            g0 = time.monotonic()
            with session(key):
                completion = self.engine.generate(ids, sampling)
            generate_s = time.monotonic() - g0
            message, finish = rec.record(completion, version, self.stop_id)
            rec.generate_s += generate_s
            rec.serve_s += time.monotonic() - t0 - generate_s
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or self.model_name,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(completion.token_ids),
                      "total_tokens": len(ids) + len(completion.token_ids)},
        }

    def app(self):
        """The ASGI app: /v1/chat/completions, /v1/models, /health."""
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse, StreamingResponse

        app = FastAPI(title="sao-swe rollout endpoint")

        def error(status: int, message: str, kind: str, code: str | None = None, param: str | None = None):
            return JSONResponse({"error": {"message": message, "type": kind, "code": code, "param": param}},
                                status_code=status)

        @app.get("/health")
        async def health():
            return {"status": "ok", "rollouts": len(self._rollouts)}

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "sao-swe"}]}

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request):
            key = request.headers.get("x-rollout-id") or ""
            auth = request.headers.get("authorization", "")
            if not key and auth.lower().startswith("bearer "):
                key = auth[7:].strip()
            try:
                body = await request.json()
            except ValueError:
                return error(400, "the request body is not JSON", "invalid_request_error")
            if not isinstance(body, dict):
                return error(400, "the request body must be a JSON object", "invalid_request_error")
            try:
                out = await asyncio.get_running_loop().run_in_executor(self._pool, self.complete, key, body)
            except PermissionError as e:
                return error(401, f"{e}: pass the rollout's key as the API key", "authentication_error", "invalid_api_key")
            except ContextFull as e:
                return error(400, str(e), "invalid_request_error", "context_length_exceeded", "messages")
            except BadRequest as e:
                return error(400, str(e), "invalid_request_error")
            except Exception as e:  # the engine failed: the scaffold sees a server error, the log says why
                log.exception("chat completion failed for rollout %s", key[:24])
                return error(500, f"{type(e).__name__}: {e}", "server_error")
            if body.get("stream"):
                return StreamingResponse(_stream(out), media_type="text/event-stream")
            return out

        return app

    def start(self) -> "ChatEndpoint":
        """Serve on `host:port` (port 0: a free one) from a daemon thread; returns when listening."""
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name=f"endpoint-{self.port}")
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the chat endpoint did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = None
        self._pool.shutdown(wait=False, cancel_futures=True)


def _stream(out: dict):
    """A finished completion as OpenAI's stream: one chunk with the whole message, then the end."""
    choice = out["choices"][0]
    delta = {k: v for k, v in choice["message"].items() if v is not None}
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(delta["tool_calls"])]
    base = {"id": out["id"], "object": "chat.completion.chunk", "created": out["created"], "model": out["model"]}
    yield f"data: {json.dumps({**base, 'choices': [{'index': 0, 'delta': delta, 'finish_reason': None}]})}\n\n"
    end = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
           "usage": out["usage"]}
    yield f"data: {json.dumps(end)}\n\n"
    yield "data: [DONE]\n\n"


# One endpoint per engine object in a process, started when a scaffold first needs it.
_ENDPOINTS: dict[int, ChatEndpoint] = {}
_ENDPOINTS_LOCK = threading.Lock()


def endpoint_for(engine: Engine, tokenizer, family: str = "hermes") -> ChatEndpoint:
    with _ENDPOINTS_LOCK:
        ep = _ENDPOINTS.get(id(engine))
        if ep is None or ep.engine is not engine:
            ep = _ENDPOINTS[id(engine)] = ChatEndpoint(engine, tokenizer, family).start()
        return ep


@atexit.register
def _close_all() -> None:
    for ep in list(_ENDPOINTS.values()):
        with contextlib.suppress(Exception):
            ep.close()
