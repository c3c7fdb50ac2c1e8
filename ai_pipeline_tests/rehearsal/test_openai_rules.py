"""Tests of the simulator's OpenAI rules mode: what OpenAI refuses is refused with OpenAI's status
and error body, and usage reports reasoning and cached tokens — through the real openai SDK."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import openai
import pytest

# What parse() sends for a pydantic model; the SDK gives it no public name (openai 3.x).
from openai.lib._pydantic import to_strict_json_schema
from openai.types.chat import ChatCompletion
from pydantic import BaseModel

from ai_pipeline.analyses import DOCUMENT_ANALYSIS as ANALYSIS
from ai_pipeline.rehearsal.analysis import estimate_tokens
from ai_pipeline.rehearsal.faults import DEFAULT_MODEL, SimulatorConfig
from ai_pipeline.rehearsal.openai_rules import (
    OPENAI_MODELS,
    is_reasoning_model,
    reasoning_tokens,
    strict_schema_problem,
)
from ai_pipeline.rehearsal.simulator import SimulatorServer

TEXT = (
    "My order #4471 was delayed by two weeks and arrived broken. Maria Keller from the "
    "Rotterdam depot promised a refund on Monday, but nothing happened."
)


@pytest.fixture(scope="module")
def server() -> Iterator[SimulatorServer]:
    with SimulatorServer(SimulatorConfig(openai_rules=True)) as running:
        yield running


@pytest.fixture(autouse=True)
def clean(request: pytest.FixtureRequest) -> None:
    if "server" in request.fixturenames:
        shared: SimulatorServer = request.getfixturevalue("server")
        shared.set_faults([])
        shared.reset()


def client_for(server: SimulatorServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0, timeout=10)


def create(
    server: SimulatorServer, model: str = "gpt-4o-mini", text: str = TEXT, **params: Any
) -> ChatCompletion:
    messages: Any = ANALYSIS.messages(text)
    return client_for(server).chat.completions.create(model=model, messages=messages, **params)


def refusal(
    server: SimulatorServer, error: type[openai.APIStatusError], **params: Any
) -> dict[str, Any]:
    """The whole error body of a request that must be refused with ``error``."""
    with pytest.raises(error) as caught:
        create(server, **params)
    body: dict[str, Any] = caught.value.response.json()
    assert caught.value.body == body["error"]
    return body


def invalid(message: str, param: str | None, code: str | None) -> dict[str, Any]:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return {"error": error}


# -- reasoning models --------------------------------------------------------------------------


def test_reasoning_models_are_told_apart_by_name() -> None:
    """o1, o3, o4 and gpt-5 names are reasoning models; gpt-5-chat and the others are not."""
    for name in ("o1", "o1-mini", "o3", "o3-pro", "o4-mini", "gpt-5", "gpt-5-mini", "gpt-5-nano"):
        assert is_reasoning_model(name), name
    for name in ("gpt-5-chat-latest", "gpt-4o", "gpt-4o-mini", "gpt-4.1-mini", DEFAULT_MODEL):
        assert not is_reasoning_model(name), name


@pytest.mark.parametrize(("value", "shown"), [(0, "0"), (0.2, "0.2"), (2, "2")])
def test_a_reasoning_model_refuses_a_temperature_other_than_one(
    server: SimulatorServer, value: float, shown: str
) -> None:
    """temperature ≠ 1 on o4-mini gets OpenAI's 400 unsupported_value naming the value sent."""
    body = refusal(server, openai.BadRequestError, model="o4-mini", temperature=value)
    assert body == invalid(
        f"Unsupported value: 'temperature' does not support {shown} with this model. "
        "Only the default (1) value is supported.",
        "temperature",
        "unsupported_value",
    )
    assert server.stats()["by_status"] == {"400": 1}


def test_a_reasoning_model_refuses_max_tokens_top_p_and_logprobs(server: SimulatorServer) -> None:
    """max_tokens and logprobs get unsupported_parameter, top_p ≠ 1 unsupported_value."""
    assert refusal(server, openai.BadRequestError, model="gpt-5-mini", max_tokens=50) == invalid(
        "Unsupported parameter: 'max_tokens' is not supported with this model. "
        "Use 'max_completion_tokens' instead.",
        "max_tokens",
        "unsupported_parameter",
    )
    assert refusal(server, openai.BadRequestError, model="o4-mini", top_p=0.5) == invalid(
        "Unsupported value: 'top_p' does not support 0.5 with this model. "
        "Only the default (1) value is supported.",
        "top_p",
        "unsupported_value",
    )
    body = refusal(server, openai.BadRequestError, model="o4-mini", logprobs=True)
    assert body["error"]["param"] == "logprobs"
    assert body["error"]["code"] == "unsupported_parameter"


def test_what_a_reasoning_model_accepts(server: SimulatorServer) -> None:
    """o4-mini accepts temperature 1 and max_completion_tokens; gpt-4o accepts temperature 0
    and max_tokens; gpt-5-chat models are not reasoning models."""
    assert create(server, model="o4-mini", temperature=1, max_completion_tokens=5000).choices
    assert create(server, model="gpt-4o", temperature=0, max_tokens=5000).choices
    config = SimulatorConfig(openai_rules=True, models=("gpt-5-chat-latest",))
    with SimulatorServer(config) as chat_server:
        usage = create(chat_server, model="gpt-5-chat-latest", temperature=0).usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens == 0


def test_reasoning_tokens_are_counted_in_completion_tokens(server: SimulatorServer) -> None:
    """A reasoning model's usage reports reasoning tokens (> 0, the same for the same text)
    inside completion_tokens; other models report 0."""
    first, second = create(server, model="o4-mini"), create(server, model="o4-mini")
    usage = first.usage
    assert usage is not None and usage.completion_tokens_details is not None
    thinking = usage.completion_tokens_details.reasoning_tokens
    assert thinking == reasoning_tokens(TEXT) and thinking is not None and thinking > 0
    assert second.usage == usage
    content = first.choices[0].message.content or ""
    assert usage.completion_tokens == thinking + estimate_tokens(content)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    plain = create(server, model="gpt-4o-mini").usage
    assert plain is not None and plain.completion_tokens_details is not None
    assert plain.completion_tokens_details.reasoning_tokens == 0
    assert plain.completion_tokens == estimate_tokens(content)


def test_max_completion_tokens_holds_reasoning_and_content(server: SimulatorServer) -> None:
    """A limit the reasoning fits in but not the whole reply cuts the content ("length"); a limit
    the reasoning uses up leaves the content empty."""
    thinking = reasoning_tokens(TEXT)
    cut = create(server, model="o4-mini", max_completion_tokens=thinking + 10)
    assert cut.choices[0].finish_reason == "length"
    assert 0 < estimate_tokens(cut.choices[0].message.content or "") <= 10
    assert cut.usage is not None and cut.usage.completion_tokens <= thinking + 10

    spent = create(server, model="o4-mini", max_completion_tokens=thinking)
    assert spent.choices[0].finish_reason == "length"
    assert spent.choices[0].message.content == ""
    assert spent.usage is not None and spent.usage.completion_tokens == thinking
    details = spent.usage.completion_tokens_details
    assert details is not None and details.reasoning_tokens == thinking


# -- models served -----------------------------------------------------------------------------


def test_a_model_not_served_is_not_found(server: SimulatorServer) -> None:
    """A model outside the served list gets 404 model_not_found with OpenAI's message, in chat
    and in /v1/models/{id}; the list is OpenAI's common models and the simulator's own."""
    body = refusal(server, openai.NotFoundError, model="gpt-3.5-turbo-instruct-0914")
    assert body == invalid(
        "The model `gpt-3.5-turbo-instruct-0914` does not exist or you do not have access to it.",
        None,
        "model_not_found",
    )
    client = client_for(server)
    assert [m.id for m in client.models.list()] == [*OPENAI_MODELS, DEFAULT_MODEL]
    assert client.models.retrieve("gpt-4o").id == "gpt-4o"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")
    assert create(server, model=DEFAULT_MODEL).choices


def test_the_served_models_can_be_chosen_in_any_mode() -> None:
    """models= serves exactly those names, also outside rules mode; a dated name with the
    served suffix is served too."""
    config = SimulatorConfig(models=("alpha", "beta"), served_model_suffix="-2024-07-18")
    with SimulatorServer(config) as custom:
        assert [m.id for m in client_for(custom).models.list()] == ["alpha", "beta"]
        assert create(custom, model="beta-2024-07-18").model == "beta-2024-07-18-2024-07-18"
        assert create(custom, model="alpha", temperature=0).model == "alpha-2024-07-18"
        with pytest.raises(openai.NotFoundError):
            create(custom, model="gpt-4o-mini")
    with pytest.raises(ValueError, match="models must be non-empty names"):
        SimulatorConfig(models=())


# -- response formats, n -----------------------------------------------------------------------


def test_json_mode_needs_the_word_json_in_the_messages(server: SimulatorServer) -> None:
    """json_object without "json" in any message is refused as OpenAI refuses it."""
    with pytest.raises(openai.BadRequestError) as caught:
        client_for(server).chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": TEXT}],
            response_format={"type": "json_object"},
        )
    assert caught.value.response.json() == invalid(
        "'messages' must contain the word 'json' in some form, to use 'response_format' of type "
        "'json_object'.",
        "messages",
        None,
    )
    reply = create(server, response_format={"type": "json_object"})  # the prompt says JSON
    assert reply.choices[0].finish_reason == "stop"


def schema_request(schema: dict[str, Any], strict: bool = True) -> Any:
    return {
        "type": "json_schema",
        "json_schema": {"name": "Review", "schema": schema, "strict": strict},
    }


def test_a_strict_schema_outside_the_strict_subset_is_refused(server: SimulatorServer) -> None:
    """A strict schema missing a required key or additionalProperties: false (at any depth), or
    whose root is not an object, gets OpenAI's 400 naming the place and the problem."""
    loose = {
        "type": "object",
        "properties": {"x": {"type": "string"}, "y": {"type": "integer"}},
        "required": ["y"],
        "additionalProperties": False,
    }
    nested = {
        "type": "object",
        "properties": {"party": {"type": "object", "properties": {}, "required": []}},
        "required": ["party"],
        "additionalProperties": False,
    }
    cases = {
        "In context=(), 'required' is required to be supplied and to be an array including "
        "every key in properties. Missing 'x'.": loose,
        "In context=('properties', 'party'), 'additionalProperties' is required to be supplied "
        "and to be false.": nested,
        "schema must be a JSON Schema of 'type: \"object\"', got 'type: \"array\"'.": {
            "type": "array",
            "items": {"type": "string"},
        },
    }
    for problem, schema in cases.items():
        body = refusal(server, openai.BadRequestError, response_format=schema_request(schema))
        assert body == invalid(
            f"Invalid schema for response_format 'Review': {problem}", "response_format", None
        )
    # Without strict the same schema is answered, as OpenAI answers it (best effort).
    assert create(server, response_format=schema_request(loose, strict=False)).choices


def test_schemas_the_sdk_builds_from_pydantic_models_are_in_the_strict_subset(
    server: SimulatorServer,
) -> None:
    """The openai SDK's strict schema of a nested pydantic model is accepted and answered;
    pydantic's own schema of it is not strict."""

    class Party(BaseModel):
        name: str
        role: str | None

    class Review(BaseModel):
        parties: list[Party]
        main: Party

    assert strict_schema_problem(to_strict_json_schema(Review)) is None
    plain = strict_schema_problem(Review.model_json_schema())  # pydantic's own: not strict
    assert plain == (
        "In context=(), 'additionalProperties' is required to be supplied and to be false."
    )
    messages: Any = ANALYSIS.messages(TEXT)
    parsed = client_for(server).chat.completions.parse(
        model="gpt-4o-mini", messages=messages, response_format=Review
    )
    assert isinstance(parsed.choices[0].message.parsed, Review)


def test_more_than_one_choice_is_refused(server: SimulatorServer) -> None:
    """n > 1 gets a 400 naming n, and n=1 is accepted."""
    body = refusal(server, openai.BadRequestError, n=2)
    assert body["error"]["param"] == "n" and body["error"]["code"] == "unsupported_value"
    assert len(create(server, n=1).choices) == 1


def test_a_refused_request_spends_no_fault_rule(server: SimulatorServer) -> None:
    """A request refused by the rules reaches no model: a one-time fault waits for the next."""
    server.set_faults([{"kind": "status", "status": 503, "times": 1}])
    refusal(server, openai.NotFoundError, model="unknown-model")
    with pytest.raises(openai.InternalServerError):
        create(server)
    assert server.stats()["by_status"] == {"404": 1, "503": 1}


# -- prompt caching ----------------------------------------------------------------------------

LONG = " ".join(
    f"Clause {i}: Harbor Supplies delivers order {i} to Lisbon within ten days of the request."
    for i in range(1, 100)
)


def test_a_long_prompt_seen_before_has_its_prefix_cached(server: SimulatorServer) -> None:
    """A prompt of 1,024+ tokens sent again reports its length cached, rounded down to 128-token
    steps; a prompt sharing only its start, that start; another model, a short prompt, nothing."""
    first = create(server, text=LONG).usage
    assert first is not None and first.prompt_tokens >= 2000
    assert first.prompt_tokens_details is not None
    assert first.prompt_tokens_details.cached_tokens == 0

    again = create(server, text=LONG).usage
    assert again is not None and again.prompt_tokens_details is not None
    cached = again.prompt_tokens_details.cached_tokens
    assert cached == 1024 + (again.prompt_tokens - 1024) // 128 * 128

    half = create(server, text=LONG[: len(LONG) // 2] + " A different ending. " * 80).usage
    assert half is not None and half.prompt_tokens_details is not None
    shared = half.prompt_tokens_details.cached_tokens
    assert shared is not None and cached is not None
    assert 1024 <= shared < cached and (shared - 1024) % 128 == 0

    other_model = create(server, model="gpt-4o", text=LONG).usage
    short = create(server, text=TEXT).usage
    for usage in (other_model, short):
        assert usage is not None and usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == 0
    server.reset()
    after_reset = create(server, text=LONG).usage
    assert after_reset is not None and after_reset.prompt_tokens_details is not None
    assert after_reset.prompt_tokens_details.cached_tokens == 0


def test_prompt_caching_alone_and_the_default_usage() -> None:
    """prompt_caching=True reports cached tokens outside rules mode; by default usage has no
    details and nothing OpenAI would refuse is refused."""
    with SimulatorServer(SimulatorConfig(prompt_caching=True)) as caching:
        create(caching, text=LONG)
        usage = create(caching, text=LONG).usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert (usage.prompt_tokens_details.cached_tokens or 0) >= 1024
        assert usage.completion_tokens_details is None
    with SimulatorServer(SimulatorConfig()) as lenient:
        reply = create(lenient, model="o4-mini", temperature=0, max_tokens=5000, n=2)
        assert reply.model == "o4-mini" and reply.usage is not None
        assert reply.usage.prompt_tokens_details is None
        assert reply.usage.completion_tokens_details is None


# -- the command line --------------------------------------------------------------------------


def test_simulate_llm_flags_configure_the_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """--openai-rules, --models and --prompt-caching reach the simulator's configuration."""
    from ai_pipeline.cli import build_parser
    from ai_pipeline.cli.common import UsageError
    from ai_pipeline.rehearsal import simulator

    seen: list[SimulatorConfig] = []
    monkeypatch.setattr(simulator, "serve", lambda config, **_: seen.append(config))
    parser = build_parser()

    def run(*flags: str) -> SimulatorConfig:
        args: argparse.Namespace = parser.parse_args(["simulate-llm", *flags])
        args.func(args)
        return seen[-1]

    default = run()
    assert (default.openai_rules, default.served_models, default.caches_prompts) == (
        False,
        None,
        False,
    )
    rules = run("--openai-rules")
    assert rules.served_models == (*OPENAI_MODELS, DEFAULT_MODEL) and rules.caches_prompts
    chosen = run("--models", "gpt-4o, o3 ,", "--prompt-caching")
    assert chosen.served_models == ("gpt-4o", "o3") and chosen.caches_prompts
    assert not chosen.openai_rules
    with pytest.raises(UsageError, match="--models"):
        run("--models", " , ")
