"""`OpenAIChatModel`: a `Model` for any OpenAI-compatible `/v1/chat/completions` endpoint.

OpenAI itself, and the many servers that speak its wire format (vLLM, llama.cpp, Ollama, LM Studio,
LiteLLM, OpenRouter, ...). Plain HTTP through httpx; no SDK. Not imported by `interceptor_core` itself,
so importing the core never loads httpx.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from interceptor_core.context import new_id
from interceptor_core.exceptions import CallgateError, ConfigurationError
from interceptor_core.messages import Message, ModelTurn, ToolCallRequest, Usage

__all__ = ["ModelError", "OpenAIChatModel"]

# How much of an error body goes into a `ModelError`: enough to read the provider's message, short
# enough that a huge HTML error page does not flood a log line.
_EXCERPT_CHARS = 300

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class ModelError(CallgateError):
    """A model endpoint failed: an HTTP error, an unreachable server, a malformed answer, a missing key.

    `status` is the HTTP status of the last response (None when no response came: connection error,
    timeout, missing key). `body_excerpt` is the start of that response's body, whitespace collapsed
    and with the API key masked.
    """

    def __init__(self, message: str, *, status: int | None = None, body_excerpt: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.body_excerpt = body_excerpt


class OpenAIChatModel:
    """A `Model` that POSTs to `{base_url}/chat/completions` of an OpenAI-compatible server.

    Contract:

    - The API key is read from the environment variable `api_key_env` on every call, never stored. If it
      is unset (or empty) the call raises `ModelError` naming the variable before sending anything,
      unless `base_url` is a loopback address (local servers usually need no key): then no
      `Authorization` header is sent.
    - 429, 5xx, connection errors and timeouts are retried up to `max_retries` times, waiting
      `backoff_s * 2**n` (n = 0, 1, ...) or the server's `Retry-After` seconds when given, each wait
      capped at `max_backoff_s`. Any other 4xx raises `ModelError` at once. When the retries run out
      the last failure is raised as `ModelError`.
    - Tool-call arguments that are not a JSON object are kept as `{"_raw": "<the text>"}`, so the gate's
      validation refuses the call with a message the model can read instead of ending the run.
    - `temperature` is sent when not None; `extra_body` is merged into the request body last, so it
      can add provider-specific fields (`max_tokens`, `seed`, `response_format`, ...).
    - One `httpx.AsyncClient` is created on first use (so the object can be built outside an event
      loop) and shared by every call; `aclose()` closes it (a later call opens a new one). `transport`
      replaces httpx's network transport (tests, proxies). `sleep` replaces `asyncio.sleep` for the
      backoff waits (tests).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        temperature: float | None = None,
        extra_body: Mapping[str, Any] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not model:
            raise ConfigurationError("OpenAIChatModel needs a model name")
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigurationError(f"base_url must be an http(s) URL with a host, got {base_url!r}")
        if not api_key_env:
            raise ConfigurationError("api_key_env must name an environment variable")
        if not (timeout_s > 0):
            raise ConfigurationError(f"timeout_s must be > 0, got {timeout_s}")
        if max_retries < 0:
            raise ConfigurationError(f"max_retries must be >= 0, got {max_retries}")
        if not (backoff_s >= 0 and max_backoff_s >= 0):
            raise ConfigurationError(f"backoff_s and max_backoff_s must be >= 0, got {backoff_s}, {max_backoff_s}")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.temperature = temperature
        self.extra_body: dict[str, Any] = dict(extra_body or {})
        self._url = f"{self.base_url}/chat/completions"
        self._loopback = _is_loopback(url.host)
        self._transport = transport
        self._sleep = sleep
        self._client: httpx.AsyncClient | None = None

    def __repr__(self) -> str:
        # Names the variable, never its value.
        return f"OpenAIChatModel(model={self.model!r}, base_url={self.base_url!r}, api_key_env={self.api_key_env!r})"

    async def __aenter__(self) -> OpenAIChatModel:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the shared HTTP client, if one was opened. Safe to call twice."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> ModelTurn:
        """Send the conversation and tool definitions; return the first choice as a `ModelTurn`.

        Raises `ModelError` for a missing key, a non-retryable HTTP error, exhausted retries, or a
        success response that is not a chat completion.
        """
        headers = {"Accept": "application/json"}
        key = self._api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = self._request_body(messages, tools)
        response = await self._post(body, headers, key)
        return _parse_turn(response, key)

    def _api_key(self) -> str | None:
        key = os.environ.get(self.api_key_env)
        if key:
            return key
        if self._loopback:
            return None
        raise ModelError(
            f"environment variable {self.api_key_env} is not set: it must hold the API key for {self.base_url}"
        )

    def _request_body(self, messages: list[Message], tools: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": [_wire_message(m) for m in messages]}
        if tools:
            body["tools"] = [_wire_tool(t) for t in tools]
        if self.temperature is not None:
            body["temperature"] = self.temperature
        body.update(self.extra_body)
        return body

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s, transport=self._transport)
        return self._client

    async def _post(self, body: dict[str, Any], headers: dict[str, str], key: str | None) -> httpx.Response:
        client = self._get_client()
        attempt = 0
        while True:
            try:
                response = await client.post(self._url, json=body, headers=headers)
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                # Transient by nature: the server may be restarting or overloaded.
                if attempt >= self.max_retries:
                    raise ModelError(
                        f"POST {self._url} failed after {attempt + 1} attempts: {type(exc).__name__}: {exc}"
                    ) from exc
                delay = self._backoff(attempt)
            except httpx.HTTPError as exc:
                # Bad URL, unsupported protocol, proxy misconfiguration: retrying cannot help.
                raise ModelError(f"POST {self._url} failed: {type(exc).__name__}: {exc}") from exc
            else:
                status = response.status_code
                if status < 400:
                    return response
                excerpt = _excerpt(response.text, key)
                retryable = status == 429 or status >= 500
                if not retryable or attempt >= self.max_retries:
                    tries = f" after {attempt + 1} attempts" if retryable else ""
                    raise ModelError(
                        f"POST {self._url} failed with HTTP {status}{tries}: {excerpt}",
                        status=status,
                        body_excerpt=excerpt,
                    )
                asked = _retry_after(response.headers)
                delay = self._backoff(attempt) if asked is None else min(asked, self.max_backoff_s)
            attempt += 1
            await self._sleep(delay)

    def _backoff(self, attempt: int) -> float:
        return float(min(self.backoff_s * 2**attempt, self.max_backoff_s))


def _is_loopback(host: str) -> bool:
    host = host.lower().rstrip(".")
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _wire_message(message: Message) -> dict[str, Any]:
    # `Message.name` is not sent: strict OpenAI-compatible servers reject fields they do not know.
    if message.role == "assistant":
        if not message.tool_calls:
            return {"role": "assistant", "content": message.content or ""}
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.args)},
                }
                for call in message.tool_calls
            ],
        }
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content or ""}
    return {"role": message.role, "content": message.content or ""}


def _wire_tool(definition: Mapping[str, Any]) -> dict[str, Any]:
    # `Tool.definition()` gives the schema under both keys; accept a dict that has only the MCP one.
    parameters = definition.get("parameters") or definition.get("input_schema") or {"type": "object"}
    function: dict[str, Any] = {"name": definition["name"], "parameters": parameters}
    if definition.get("description"):
        function["description"] = definition["description"]
    return {"type": "function", "function": function}


def _retry_after(headers: httpx.Headers) -> float | None:
    """The server's requested wait in seconds, if it gave one as a number (HTTP dates are ignored)."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def _excerpt(text: str, key: str | None) -> str:
    text = " ".join(text.split())
    if key:
        # Some servers echo the credential they rejected; it must not reach a log through the error.
        text = text.replace(key, "***")
    return text if len(text) <= _EXCERPT_CHARS else text[:_EXCERPT_CHARS] + "…"


def _parse_turn(response: httpx.Response, key: str | None) -> ModelTurn:
    def malformed(why: str) -> ModelError:
        excerpt = _excerpt(response.text, key)
        return ModelError(
            f"{response.request.url} answered HTTP {response.status_code} but {why}: {excerpt}",
            status=response.status_code,
            body_excerpt=excerpt,
        )

    try:
        payload: Any = response.json()
    except ValueError:
        raise malformed("the body is not JSON") from None
    if not isinstance(payload, dict):
        raise malformed("the body is not a JSON object")
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise malformed("there is no choice in the answer")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise malformed("the first choice has no message")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise malformed("tool_calls is not a list")
    calls = [_parse_call(raw) for raw in raw_calls if isinstance(raw, dict)]
    return ModelTurn(text=_text(message), tool_calls=calls, usage=_usage(payload.get("usage")))


def _text(message: dict[str, Any]) -> str | None:
    content = message.get("content")
    if isinstance(content, list):
        # Some servers answer with content parts instead of one string.
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict)) or None
    if not content and isinstance(message.get("refusal"), str):
        # OpenAI puts a safety refusal here with content null; it is still the model's answer.
        content = message["refusal"]
    return content if isinstance(content, str) else None


def _parse_call(raw: dict[str, Any]) -> ToolCallRequest:
    function = raw.get("function")
    function = function if isinstance(function, dict) else {}
    # Some local servers omit the id; the tool message must still be able to answer this call.
    call_id = raw.get("id") or f"call_{new_id()[-12:]}"
    return ToolCallRequest(id=str(call_id), name=str(function.get("name") or ""), args=_parse_args(function))


def _parse_args(function: dict[str, Any]) -> dict[str, Any]:
    arguments = function.get("arguments")
    if isinstance(arguments, dict):
        # A few servers send the object itself rather than its JSON text.
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        # A call of a tool without parameters often comes with empty arguments.
        return {}
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"_raw": text}
    return parsed if isinstance(parsed, dict) else {"_raw": text}


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None

    def count(name: str) -> int:
        value = raw.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return Usage(input_tokens=count("prompt_tokens"), output_tokens=count("completion_tokens"))
