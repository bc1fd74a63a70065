"""OpenAIChatModel against a real local HTTP server that plays an OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from interceptor_core import Agent, ConfigurationError, Gate, tool
from interceptor_core.messages import Message, ToolCallRequest, Usage
from interceptor_core.openai_model import ModelError, OpenAIChatModel

KEY_ENV = "CALLGATE_TEST_OPENAI_KEY"
SECRET = "sk-test-0123456789abcdefSECRET"  # noqa: S105 - a fake key, to prove it never leaks

LOOKUP_TOOL: dict[str, Any] = {
    "name": "get_order",
    "description": "Loads an order record by ID",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    "input_schema": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
}


@dataclass
class Scripted:
    """One answer the fake server gives: status, headers, body (JSON, or a str sent as is)."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    hold: bool = False  # wait (without answering) until the server shuts down: a slow server


@dataclass
class Seen:
    """One request the fake server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any


class FakeServer:
    """A ThreadingHTTPServer on 127.0.0.1 that records requests and answers from a script."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.responses: deque[Scripted] = deque()
        self.release = threading.Event()
        lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen = Seen("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw))
                with lock:
                    fake.requests.append(seen)
                    answer = fake.responses.popleft() if fake.responses else Scripted(500, {"error": "unscripted"})
                if answer.hold:
                    fake.release.wait(10)
                payload = answer.body if isinstance(answer.body, str) else json.dumps(answer.body)
                data = payload.encode()
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up on a held request

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A short poll interval so shutdown() at teardown returns at once rather than after 0.5 s.
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def script(self, *responses: Scripted) -> None:
        self.responses.extend(responses)


class FakeSleep:
    """Records the backoff delays instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def completion(
    content: str | None = None, tool_calls: list[dict[str, Any]] | None = None, usage: dict[str, int] | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def wire_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
    fake.thread.start()
    yield fake
    fake.release.set()
    fake.httpd.shutdown()
    fake.httpd.server_close()
    fake.thread.join(5)


@pytest.fixture
def fake_sleep() -> FakeSleep:
    return FakeSleep()


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port that is bound (so nobody else takes it) but not listening: connections are refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


@pytest.fixture
async def make_model(
    server: FakeServer, fake_sleep: FakeSleep, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Callable[..., OpenAIChatModel]]:
    monkeypatch.delenv(KEY_ENV, raising=False)
    made: list[OpenAIChatModel] = []

    def make(**kwargs: Any) -> OpenAIChatModel:
        kwargs.setdefault("base_url", server.base_url)
        kwargs.setdefault("api_key_env", KEY_ENV)
        kwargs.setdefault("sleep", fake_sleep)
        model = OpenAIChatModel("test-model", **kwargs)
        made.append(model)
        return model

    yield make
    for model in made:
        await model.aclose()


CONVERSATION = [
    Message("system", "You are a support agent."),
    Message("user", "Refund order A-1."),
    Message("assistant", "Looking it up.", tool_calls=(ToolCallRequest("call_1", "get_order", {"order_id": "A-1"}),)),
    Message("tool", '{"amount_cents": 4200}', tool_call_id="call_1", name="get_order"),
]


class TestRequest:
    async def test_messages_tools_and_options_are_mapped(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]
    ) -> None:
        """The body has the model, all four roles in OpenAI form, the tools as functions, temperature, extra_body."""
        server.script(Scripted(body=completion("ok")))
        model = make_model(temperature=0.2, extra_body={"max_tokens": 64, "seed": 7})
        await model.complete(CONVERSATION, [LOOKUP_TOOL])
        (seen,) = server.requests
        assert (seen.method, seen.path) == ("POST", "/v1/chat/completions")
        assert seen.body["model"] == "test-model"
        assert seen.body["messages"] == [
            {"role": "system", "content": "You are a support agent."},
            {"role": "user", "content": "Refund order A-1."},
            {
                "role": "assistant",
                "content": "Looking it up.",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_order", "arguments": '{"order_id": "A-1"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"amount_cents": 4200}'},
        ]
        assert seen.body["tools"] == [
            {
                "type": "function",
                "function": {
                    "name": "get_order",
                    "description": "Loads an order record by ID",
                    "parameters": LOOKUP_TOOL["parameters"],
                },
            }
        ]
        assert (seen.body["temperature"], seen.body["max_tokens"], seen.body["seed"]) == (0.2, 64, 7)

    async def test_assistant_tool_calls_without_text_send_null_content(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]
    ) -> None:
        """An assistant message that only calls tools is sent with content null."""
        server.script(Scripted(body=completion("ok")))
        calling = Message("assistant", None, tool_calls=(ToolCallRequest("c", "get_order", {"order_id": "B"}),))
        await make_model().complete([Message("user", "hi"), calling], [])
        assert server.requests[0].body["messages"][1]["content"] is None

    async def test_tools_and_temperature_omitted_when_absent(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]
    ) -> None:
        """With no tools and no temperature, neither key is in the body."""
        server.script(Scripted(body=completion("ok")))
        await make_model().complete([Message("user", "hi")], [])
        assert set(server.requests[0].body) == {"model", "messages"}

    async def test_authorization_carries_the_key_from_the_environment(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The bearer token is the value of the named variable, read at call time."""
        model = make_model()
        monkeypatch.setenv(KEY_ENV, SECRET)
        server.script(Scripted(body=completion("ok")))
        await model.complete([Message("user", "hi")], [])
        assert server.requests[0].headers["authorization"] == f"Bearer {SECRET}"

    async def test_loopback_without_a_key_sends_no_authorization(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]
    ) -> None:
        """A loopback server with the variable unset gets no Authorization header and no error."""
        server.script(Scripted(body=completion("ok")))
        turn = await make_model().complete([Message("user", "hi")], [])
        assert turn.text == "ok"
        assert "authorization" not in server.requests[0].headers


class TestResponse:
    async def test_text_answer(self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]) -> None:
        """A plain answer becomes a turn with text and no tool calls."""
        server.script(Scripted(body=completion("Refund issued.")))
        turn = await make_model().complete([Message("user", "hi")], [])
        assert (turn.text, turn.tool_calls) == ("Refund issued.", ())

    async def test_two_tool_calls_with_parsed_arguments(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]
    ) -> None:
        """Both tool calls come back in order, ids kept and arguments parsed from JSON."""
        calls = [
            wire_call("call_a", "get_order", '{"order_id": "A-1"}'),
            wire_call("call_b", "refund", '{"order_id": "A-1", "amount_cents": 4200}'),
        ]
        server.script(Scripted(body=completion(None, calls)))
        turn = await make_model().complete([Message("user", "hi")], [LOOKUP_TOOL])
        assert turn.text is None
        assert turn.tool_calls == (
            ToolCallRequest("call_a", "get_order", {"order_id": "A-1"}),
            ToolCallRequest("call_b", "refund", {"order_id": "A-1", "amount_cents": 4200}),
        )

    async def test_invalid_json_arguments_are_kept_raw(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]
    ) -> None:
        """Arguments that are not a JSON object keep the call, with the text under _raw."""
        calls = [wire_call("c1", "get_order", '{"order_id": "A-1"'), wire_call("c2", "get_order", "[1, 2]")]
        server.script(Scripted(body=completion(None, calls)))
        turn = await make_model().complete([Message("user", "hi")], [LOOKUP_TOOL])
        assert [call.args for call in turn.tool_calls] == [{"_raw": '{"order_id": "A-1"'}, {"_raw": "[1, 2]"}]

    async def test_usage_is_mapped(self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]) -> None:
        """prompt_tokens and completion_tokens become the turn's input and output tokens."""
        server.script(Scripted(body=completion("ok", usage={"prompt_tokens": 12, "completion_tokens": 5})))
        turn = await make_model().complete([Message("user", "hi")], [])
        assert turn.usage == Usage(input_tokens=12, output_tokens=5)

    async def test_answer_without_choices_is_a_model_error(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]
    ) -> None:
        """A 200 that is not a chat completion raises ModelError quoting the body."""
        server.script(Scripted(body={"unexpected": True}))
        with pytest.raises(ModelError, match="no choice") as caught:
            await make_model().complete([Message("user", "hi")], [])
        assert caught.value.status == 200
        assert "unexpected" in caught.value.body_excerpt


class TestRetries:
    async def test_429_then_200_honours_retry_after(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel], fake_sleep: FakeSleep
    ) -> None:
        """A 429 with Retry-After is retried after exactly that many seconds."""
        server.script(Scripted(429, {"error": "slow down"}, {"Retry-After": "3"}), Scripted(body=completion("ok")))
        turn = await make_model().complete([Message("user", "hi")], [])
        assert turn.text == "ok"
        assert len(server.requests) == 2
        assert fake_sleep.delays == [3.0]

    async def test_backoff_is_exponential_and_retry_after_is_capped(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel], fake_sleep: FakeSleep
    ) -> None:
        """Without Retry-After the waits double from backoff_s; a huge Retry-After is cut to max_backoff_s."""
        server.script(
            Scripted(503, {"error": "busy"}),
            Scripted(502, {"error": "bad gateway"}),
            Scripted(429, {"error": "later"}, {"Retry-After": "3600"}),
            Scripted(body=completion("ok")),
        )
        turn = await make_model(backoff_s=0.5, max_backoff_s=10.0).complete([Message("user", "hi")], [])
        assert turn.text == "ok"
        assert fake_sleep.delays == [0.5, 1.0, 10.0]

    async def test_persistent_500_raises_after_max_retries(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel], fake_sleep: FakeSleep
    ) -> None:
        """max_retries + 1 attempts of HTTP 500 end in a ModelError naming the status."""
        server.script(*[Scripted(500, {"error": "boom"}) for _ in range(3)])
        with pytest.raises(ModelError, match="HTTP 500") as caught:
            await make_model(max_retries=2).complete([Message("user", "hi")], [])
        assert caught.value.status == 500
        assert len(server.requests) == 3
        assert len(fake_sleep.delays) == 2

    async def test_400_raises_at_once(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel], fake_sleep: FakeSleep
    ) -> None:
        """A 400 is not retried: one request, no wait, the status and body excerpt in the error."""
        server.script(Scripted(400, {"error": {"message": "Unknown parameter: 'foo'."}}))
        with pytest.raises(ModelError, match=r"HTTP 400.*Unknown parameter") as caught:
            await make_model().complete([Message("user", "hi")], [])
        assert caught.value.status == 400
        assert len(server.requests) == 1
        assert fake_sleep.delays == []

    async def test_connection_refused_is_retried_then_raised(
        self, dead_port: int, make_model: Callable[..., OpenAIChatModel], fake_sleep: FakeSleep
    ) -> None:
        """A port nobody listens on is tried max_retries + 1 times, then ModelError without a status."""
        model = make_model(base_url=f"http://127.0.0.1:{dead_port}/v1", max_retries=3)
        with pytest.raises(ModelError, match="ConnectError") as caught:
            await model.complete([Message("user", "hi")], [])
        assert caught.value.status is None
        assert fake_sleep.delays == [0.5, 1.0, 2.0]

    async def test_timeout_is_retried(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel], fake_sleep: FakeSleep
    ) -> None:
        """A server slower than timeout_s is retried, and the next attempt's answer is returned."""
        server.script(Scripted(body=completion("late"), hold=True), Scripted(body=completion("ok")))
        turn = await make_model(timeout_s=0.2).complete([Message("user", "hi")], [])
        assert turn.text == "ok"
        assert len(server.requests) == 2
        assert fake_sleep.delays == [0.5]


class TestApiKey:
    async def test_missing_key_for_a_remote_url_raises_before_sending(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]
    ) -> None:
        """Without the variable, a non-loopback base_url raises ModelError naming it and sends nothing."""
        model = make_model(base_url="http://api.example.invalid/v1")
        with pytest.raises(ModelError, match=KEY_ENV):
            await model.complete([Message("user", "hi")], [])
        assert server.requests == []

    async def test_key_is_never_in_repr_or_errors(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """repr names the variable, not the key; an error body echoing the key is masked."""
        monkeypatch.setenv(KEY_ENV, SECRET)
        model = make_model()
        server.script(Scripted(401, {"error": f"Incorrect API key provided: {SECRET}"}))
        with pytest.raises(ModelError, match="HTTP 401") as caught:
            await model.complete([Message("user", "hi")], [])
        assert SECRET not in repr(model)
        assert KEY_ENV in repr(model)
        assert SECRET not in str(caught.value)
        assert SECRET not in caught.value.body_excerpt


class TestLifecycle:
    def test_builds_outside_an_event_loop(self) -> None:
        """Construction opens no client, so it needs no running loop."""
        model = OpenAIChatModel("m", base_url="http://localhost:1/v1")
        assert repr(model) == (
            "OpenAIChatModel(model='m', base_url='http://localhost:1/v1', api_key_env='OPENAI_API_KEY')"
        )

    async def test_aclose_then_reuse(self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]) -> None:
        """After aclose() a later call opens a fresh client; aclose() twice is harmless."""
        server.script(Scripted(body=completion("one")), Scripted(body=completion("two")))
        model = make_model()
        assert (await model.complete([Message("user", "hi")], [])).text == "one"
        await model.aclose()
        await model.aclose()
        assert (await model.complete([Message("user", "hi")], [])).text == "two"

    @pytest.mark.parametrize(
        "kwargs",
        [{"base_url": "ftp://x/v1"}, {"timeout_s": 0}, {"max_retries": -1}, {"backoff_s": -1.0}],
    )
    def test_bad_settings_are_configuration_errors(self, kwargs: dict[str, Any]) -> None:
        """Impossible settings fail when the model is built, not on the first call."""
        with pytest.raises(ConfigurationError):
            OpenAIChatModel("m", **kwargs)


class TestWithTheAgentLoop:
    async def test_agent_runs_tools_through_the_gate_and_reads_the_answer(
        self, server: FakeServer, make_model: Callable[..., OpenAIChatModel]
    ) -> None:
        """An Agent drives the model over HTTP: a valid call runs, a call with broken JSON is refused and never runs."""
        refunded: list[str] = []

        @tool
        def refund(order_id: str) -> str:
            """Refunds an order."""
            refunded.append(order_id)
            return f"refunded {order_id}"

        scope = Gate("shop").workflow("support").agent("desk", tools=[refund])
        calls = [wire_call("c1", "refund", '{"order_id": "A-1"}'), wire_call("c2", "refund", '{"order_id": ')]
        server.script(
            Scripted(body=completion(None, calls, usage={"prompt_tokens": 30, "completion_tokens": 9})),
            Scripted(body=completion("Refunded A-1.", usage={"prompt_tokens": 50, "completion_tokens": 4})),
        )
        result = await Agent(scope, make_model(), instructions="Be brief.").run("Refund A-1.")

        assert result.output == "Refunded A-1."
        assert refunded == ["A-1"]
        assert (result.usage.input_tokens, result.usage.output_tokens) == (80, 13)
        first, second = (seen.body for seen in server.requests)
        assert first["tools"][0]["function"]["name"] == "refund"
        assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool", "tool"]
        assistant, ok, refused = second["messages"][2:]
        assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
        assert (ok["tool_call_id"], ok["content"]) == ("c1", "refunded A-1")
        assert refused["tool_call_id"] == "c2"
        assert refused["content"].startswith("Tool error: Invalid arguments for tool refund")
