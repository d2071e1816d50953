"""`OpenAIPolicy`: replies from any OpenAI-compatible chat server, such as
`vllm serve cognition-ai/Kevin-32B`.

    policy = OpenAIPolicy()                        # KEVIN_LLM_URL, KEVIN_MODEL, ... from config
    replies = policy.generate(conversations, Sampling(temperature=0.9, seed=1))

Only the standard library speaks HTTP here (urllib, one thread per request in flight), so the
package needs no client library for it. Each conversation of a batch is its own
POST /chat/completions; the server batches them.

What can go wrong, and what the caller gets:

  no server answers (refused, reset, unknown host)   retried, then `PolicyError` naming the URL
  429 or 5xx                                          retried with backoff; a reply that still
                                                      fails carries `error`; a batch that fails
                                                      whole raises `PolicyError`
  the model is not served (404)                       `PolicyError` naming the served models
  a request takes longer than the timeout             `PolicyError` naming the URL and seconds
  any other 4xx (e.g. a prompt longer than the        that reply carries `error` (finish_reason
  context)                                            "error"); the rest of the batch is kept
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Sequence

from kevin_backend.config import env_value
from kevin_backend.generate.policy import Message, PolicyError, Reply, Sampling, split_reasoning

__all__ = ["OpenAIPolicy", "Retry"]

_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Retry:
    """How often and how patiently a request is retried when the server is unreachable or busy.

    Attempt k (from 1) that fails waits `backoff * 2**(k-1)` seconds (at most `max_delay`; a
    server's Retry-After wins when it is longer, within the same cap) before attempt k+1. The
    defaults ride out a server restart of a few seconds without making a user whose server is
    simply not running wait long for the error."""

    attempts: int = 4
    backoff: float = 0.5
    max_delay: float = 30.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        wait = self.backoff * 2 ** (attempt - 1)
        if retry_after is not None:
            wait = max(wait, retry_after)
        return min(wait, self.max_delay)


class _Unreachable(Exception):
    """No HTTP answer at all: refused, reset, or the host does not resolve."""


class _TimedOut(Exception):
    pass


class _Aborted(Exception):
    """Another request of the batch already failed for good; this one stops early."""


@dataclass(frozen=True)
class _Answer:
    status: int
    body: Any  # the parsed JSON, or the raw text when it is not JSON
    retry_after: float | None = None


class OpenAIPolicy:
    """A `Policy` over an OpenAI-compatible server. Arguments left `None` come from the
    configuration (`KEVIN_LLM_URL`, `KEVIN_MODEL`, `KEVIN_LLM_API_KEY`, `KEVIN_LLM_TIMEOUT`,
    `KEVIN_LLM_CONCURRENCY`).

    Conversation i of a batch is sampled with seed `sampling.seed + i`: the first turn of several
    trajectories is the same prompt, and one seed for all would give them all the same reply,
    while a rerun of the batch still gets the same replies.

    `timeout` bounds each wait for the server (urllib's socket timeout): connecting, and then the
    wait for the reply, which a non-streaming server sends only once the whole completion is done.
    A timed-out request is not retried: it would most likely time out again."""

    def __init__(
        self,
        url: str | None = None,
        model: str | None = None,
        *,
        api_key: str | None = None,
        timeout: float | None = None,
        concurrency: int | None = None,
        retry: Retry = Retry(),
    ) -> None:
        self.url = (url if url is not None else env_value("KEVIN_LLM_URL")).rstrip("/")
        self.model = model if model is not None else env_value("KEVIN_MODEL")
        self.api_key = api_key if api_key is not None else env_value("KEVIN_LLM_API_KEY")
        self.timeout = float(timeout if timeout is not None else env_value("KEVIN_LLM_TIMEOUT"))
        self.concurrency = int(concurrency if concurrency is not None else env_value("KEVIN_LLM_CONCURRENCY"))
        self.retry = retry
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"the LLM URL must start with http:// or https://, got {self.url!r} (KEVIN_LLM_URL)")
        if self.timeout <= 0:
            raise ValueError(f"the LLM timeout must be > 0 seconds, got {self.timeout} (KEVIN_LLM_TIMEOUT)")
        if self.concurrency < 1:
            raise ValueError(f"the LLM concurrency must be >= 1, got {self.concurrency} (KEVIN_LLM_CONCURRENCY)")
        if retry.attempts < 1:
            raise ValueError(f"retry.attempts must be >= 1, got {retry.attempts}")
        self.name = f"openai:{self.model}"
        # A local server is reached directly even where an HTTP proxy is set for the outside world.
        host = urllib.parse.urlsplit(self.url).hostname or ""
        direct = host in _LOOPBACK or host.startswith("127.")
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({})) if direct else urllib.request.build_opener()

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> "OpenAIPolicy":
        """The policy for a `kevin_backend.config.Config` (its `llm_url` and `model`, which
        `torch.compile` options may have set)."""
        return cls(config.llm_url, config.model, **kwargs)

    def count_tokens(self, text: str) -> int:
        """An estimate, not the server's tokenizer: about four characters a token, which holds
        roughly for code and English under BPE tokenizers. Good for budgeting a context, not for
        exact limits."""
        return (len(text) + 3) // 4

    # -- the batch ------------------------------------------------------------------------------

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: Sampling) -> list[Reply]:
        if not conversations:
            return []
        abort = threading.Event()
        workers = min(self.concurrency, len(conversations))
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kevin-llm")
        futures = [
            pool.submit(self._complete, list(messages), sampling, index, abort)
            for index, messages in enumerate(conversations)
        ]
        concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        failed = [f.exception() for f in futures if f.done() and not f.cancelled() and f.exception() is not None]
        if failed:
            # The batch is lost: queued requests are dropped, retrying ones stop at their next
            # wait, and the caller hears now rather than after the requests still in flight.
            abort.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise next((e for e in failed if not isinstance(e, _Aborted)), failed[0])  # type: ignore[misc]
        pool.shutdown(wait=True)
        replies = [f.result() for f in futures]
        if all(r.extra.get("status") in _RETRY_STATUSES for r in replies):
            raise PolicyError(
                f"the server at {self.url} failed every request of the batch, each after "
                f"{self.retry.attempts} attempt(s): {replies[0].error}"
            )
        return replies

    # -- one conversation -----------------------------------------------------------------------

    def _complete(self, messages: list[Message], sampling: Sampling, index: int, abort: threading.Event) -> Reply:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
        }
        if sampling.seed is not None:
            payload["seed"] = sampling.seed + index
        if sampling.stop:
            payload["stop"] = list(sampling.stop)
        endpoint = f"{self.url}/chat/completions"
        for attempt in range(1, self.retry.attempts + 1):
            if abort.is_set():
                raise _Aborted()
            start = time.perf_counter()
            try:
                answer = self._exchange("POST", "/chat/completions", payload)
            except _Unreachable as exc:
                if attempt == self.retry.attempts:
                    raise PolicyError(
                        f"no server answers at {self.url} ({exc}; {attempt} attempt(s)): start one with "
                        f"`vllm serve {self.model}` or set KEVIN_LLM_URL to the server's API base"
                    ) from None
                abort.wait(self.retry.delay(attempt))
                continue
            except _TimedOut:
                raise PolicyError(
                    f"the server at {endpoint} did not answer within {self.timeout:g} seconds "
                    f"(KEVIN_LLM_TIMEOUT); the model may be overloaded or the completion too long "
                    f"(max_tokens={sampling.max_tokens})"
                ) from None
            seconds = time.perf_counter() - start
            if answer.status == 200:
                return self._reply(answer.body, seconds)
            message = _error_message(answer.body)
            if answer.status in _RETRY_STATUSES and attempt < self.retry.attempts:
                abort.wait(self.retry.delay(attempt, answer.retry_after))
                continue
            if answer.status in (401, 403):
                raise PolicyError(
                    f"the server at {self.url} refused the request ({answer.status}: {message}): "
                    f"check the API key (KEVIN_LLM_API_KEY)"
                )
            if answer.status == 404 or (answer.status == 400 and _about_the_model(message)):
                self._check_model(answer.status, message)
            return Reply(
                text="", finish_reason="error", seconds=seconds,
                error=f"{endpoint} answered {answer.status}: {message}",
                extra={"status": answer.status, "model": self.model},
            )
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _reply(self, body: Any, seconds: float) -> Reply:
        try:
            choice = body["choices"][0]
            message = choice.get("message") or {}
            content = message.get("content") or ""
            reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            return Reply(
                text="", finish_reason="error", seconds=seconds,
                error=f"{self.url}/chat/completions answered 200 without a chat completion: {str(body)[:300]!r}",
                extra={"model": self.model},
            )
        text, reasoning = split_reasoning(content, reasoning)
        usage = body.get("usage") or {}
        return Reply(
            text=text,
            reasoning=reasoning,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            seconds=seconds,
            finish_reason=choice.get("finish_reason") or "stop",
            extra={"model": body.get("model", self.model), "id": body.get("id", "")},
        )

    def _check_model(self, status: int, message: str) -> None:
        """Raise the clear error for a 404 (or a 400 about the model): name the models the
        server has when ours is not among them, else say the URL is likely not the API base."""
        served = self.served_models()
        if served is not None and self.model not in served:
            raise PolicyError(
                f"the server at {self.url} does not serve model {self.model!r}; it serves: "
                f"{', '.join(served) or '(none)'}. Set KEVIN_MODEL to one of them"
            )
        if status == 404:
            raise PolicyError(
                f"the server at {self.url} answered 404 for /chat/completions ({message}): "
                f"is KEVIN_LLM_URL the API base (it usually ends in /v1)?"
            )

    def served_models(self) -> list[str] | None:
        """The model ids of GET /models, or None when the server does not list them."""
        try:
            answer = self._exchange("GET", "/models")
        except (_Unreachable, _TimedOut):
            return None
        if answer.status != 200 or not isinstance(answer.body, dict):
            return None
        return [str(m.get("id")) for m in answer.body.get("data") or [] if isinstance(m, dict)]

    # -- HTTP -----------------------------------------------------------------------------------

    def _exchange(self, method: str, path: str, payload: Any = None) -> _Answer:
        headers = {"Accept": "application/json"}
        data = None
        if payload is not None:
            data = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return _Answer(response.status, _parse(response.read()))
        except urllib.error.HTTPError as exc:
            with exc:
                body = _parse(exc.read())
            return _Answer(exc.code, body, _retry_after(exc.headers.get("Retry-After") if exc.headers else None))
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise _TimedOut() from None
            raise _Unreachable(str(exc.reason)) from None
        except TimeoutError:
            raise _TimedOut() from None
        except (ConnectionError, http.client.HTTPException) as exc:
            raise _Unreachable(f"{type(exc).__name__}: {exc}") from None


def _parse(raw: bytes) -> Any:
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _error_message(body: Any) -> str:
    """The message of an OpenAI-style error body ({"error": {"message": ...}}) or of vLLM's
    older flat one ({"object": "error", "message": ...}); else the body itself, shortened."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if body.get("message"):
            return str(body["message"])
    return str(body)[:500]


def _about_the_model(message: str) -> bool:
    lowered = message.lower()
    return "model" in lowered and ("does not exist" in lowered or "not found" in lowered)


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff alone decides
