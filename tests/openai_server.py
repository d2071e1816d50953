"""A small OpenAI-compatible chat server over a `TransformersPolicy`, on the loopback interface,
for testing `OpenAIPolicy` against real HTTP:

    with TinyOpenAIServer(policy, model="tiny-kevin") as server:
        OpenAIPolicy(server.url, "tiny-kevin").generate(...)

Routes: GET /v1/models and POST /v1/chat/completions, answering as vLLM does (OpenAI error
bodies, 404 for a model it does not serve, 400 for a prompt past the context length). Knobs the
tests turn, each read per request:

  delay             seconds to wait before answering a completion (timeouts)
  fail_first        answer this many completion requests 503 first (retries)
  reasoning         a chain of thought to return with every reply, placed by `reasoning_style`:
                    "reasoning_content" or "reasoning" (a message field, as vLLM's reasoning
                    parsers do) or "tags" (inside <think>...</think> in the content)
  context_tokens    prompt plus max_tokens past this is a 400

`requests` counts completion requests, `payloads` keeps their bodies and `headers` the last
one's headers.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kevin_backend.generate.policy import Sampling

__all__ = ["TinyOpenAIServer"]


class TinyOpenAIServer:
    def __init__(self, policy: Any, model: str = "tiny-kevin", context_tokens: int = 1024) -> None:
        self.policy = policy
        self.model = model
        self.default_context_tokens = context_tokens
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self.reset()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                server._route(self, "GET")

            def do_POST(self) -> None:
                server._route(self, "POST")

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, name="tiny-openai", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}/v1"

    def reset(self) -> None:
        """Knobs back to a plain, well-behaved server; counters cleared."""
        with self._lock:
            self.delay = 0.0
            self.fail_first = 0
            self.reasoning = ""
            self.reasoning_style = "reasoning_content"
            self.context_tokens = self.default_context_tokens
            self.requests = 0
            self.payloads: list[dict[str, Any]] = []
            self.headers: dict[str, str] = {}

    def start(self) -> "TinyOpenAIServer":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()  # wakes delayed handlers
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> "TinyOpenAIServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- routes ---------------------------------------------------------------------------------

    def _route(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        try:
            if method == "GET" and handler.path == "/v1/models":
                data = [{"id": self.model, "object": "model", "owned_by": "tests"}]
                return _send(handler, 200, {"object": "list", "data": data})
            if method == "POST" and handler.path == "/v1/chat/completions":
                return self._chat(handler)
            _send(handler, 404, _error(f"no route {method} {handler.path}", "NotFoundError", 404))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to answer

    def _chat(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        try:
            body = json.loads(handler.rfile.read(length) or b"{}")
        except ValueError:
            return _send(handler, 400, _error("the body is not JSON", "BadRequestError", 400))
        with self._lock:
            self.requests += 1
            number = self.requests
            self.payloads.append(body)
            self.headers = dict(handler.headers)
            delay, fail_first = self.delay, self.fail_first
            reasoning, style, context = self.reasoning, self.reasoning_style, self.context_tokens
        if delay:
            self._closing.wait(delay)
        if number <= fail_first:
            return _send(handler, 503, _error("the engine is starting", "ServiceUnavailableError", 503))
        if body.get("model") != self.model:
            message = f"The model `{body.get('model')}` does not exist."
            return _send(handler, 404, _error(message, "NotFoundError", 404))
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _send(handler, 400, _error("'messages' must be a non-empty list", "BadRequestError", 400))
        max_tokens = int(body.get("max_tokens") or 16)
        prompt_tokens = self.policy.count_tokens(self.policy.render(messages))
        if prompt_tokens + max_tokens > context:
            message = (
                f"This model's maximum context length is {context} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in "
                f"the completion). Please reduce the length of the messages or completion."
            )
            return _send(handler, 400, _error(message, "BadRequestError", 400))
        sampling = Sampling(
            temperature=float(body.get("temperature", 1.0)),
            top_p=float(body.get("top_p", 1.0)),
            max_tokens=max_tokens,
            seed=body.get("seed"),
            stop=tuple(body.get("stop") or ()),
        )
        (reply,) = self.policy.generate([messages], sampling)
        thought = "\n".join(t for t in (reasoning, reply.reasoning) if t)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if thought and style == "tags":
            message["content"] = f"<think>\n{thought}\n</think>\n\n{reply.text}"
        elif thought:
            message[style] = thought
        _send(handler, 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        })


def _error(message: str, kind: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _send(handler: BaseHTTPRequestHandler, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
