"""Unit tests of the failure taxonomy, SDK error classification, backoff, redaction, credentials
and the requests-per-minute limiter (no network)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import httpx2
import openai
import pytest

from ai_pipeline.failures import (
    RULES,
    Category,
    Disposition,
    Layer,
    category_for_reply,
    category_for_status,
)
from ai_pipeline.llm_access import Credentials, RateLimiter
from ai_pipeline.llm_errors import classify
from ai_pipeline.redaction import MASK, redact, register_secret
from ai_pipeline_tests.support import FakeTime

C = Category
REQUEST = httpx2.Request("POST", "https://llm.invalid/v1/chat/completions")

# --- classify: every exception class the SDK exports ------------------------------------------

SDK_EXCEPTIONS = sorted(
    (
        obj
        for name in dir(openai)
        if inspect.isclass(obj := getattr(openai, name)) and issubclass(obj, BaseException)
    ),
    key=lambda cls: cls.__name__,
)

EXPECTED_SDK_CATEGORIES = {
    "APITimeoutError": C.NETWORK_TIMEOUT,
    "APIConnectionError": C.NETWORK_TIMEOUT,
    "AuthenticationError": C.AUTH_FAILED,
    "OAuthError": C.AUTH_FAILED,
    "PermissionDeniedError": C.AUTH_FAILED,
    "RateLimitError": C.RATE_LIMIT_EXCEEDED,
    "BadRequestError": C.INPUT_QUALITY_ISSUE,
    "UnprocessableEntityError": C.INPUT_QUALITY_ISSUE,
    "NotFoundError": C.CONFIGURATION,
    "InternalServerError": C.NETWORK_TIMEOUT,
    "ConflictError": C.NETWORK_TIMEOUT,
    "LengthFinishReasonError": C.SCHEMA_VIOLATION,
    # The reply came but is not what was asked for: the model layer's, for a person.
    "APIResponseValidationError": C.SCHEMA_VIOLATION,
    "ContentFilterFinishReasonError": C.SCHEMA_VIOLATION,
    # A bare APIStatusError is classified by its status (here 500, as the SDK raises it).
    "APIStatusError": C.NETWORK_TIMEOUT,
    # Base classes without a status, and what only other features of the SDK raise (webhooks,
    # the realtime websocket, the module-level client): nothing a retry or a person can fix.
    "OpenAIError": C.INTERNAL_ERROR,
    "APIError": C.INTERNAL_ERROR,
    "InvalidWebhookSignatureError": C.INTERNAL_ERROR,
    "WebSocketConnectionClosedError": C.INTERNAL_ERROR,
    "WebSocketQueueFullError": C.INTERNAL_ERROR,
    "_AmbiguousModuleClientUsageError": C.INTERNAL_ERROR,
}


def _status_of(cls: type) -> int:
    """The status the SDK raises this class for (InternalServerError has no class attribute)."""
    status = getattr(cls, "status_code", None)
    return status if isinstance(status, int) else 500


def sdk_error(cls: type[BaseException]) -> BaseException:
    """An instance built as the SDK builds it, or with ``__new__`` when that needs more."""
    if issubclass(cls, openai.APIStatusError):
        response = httpx2.Response(_status_of(cls), request=REQUEST)
        if cls is openai.OAuthError:
            return cls(response=response, body=None)
        return cls("boom", response=response, body=None)
    if issubclass(cls, openai.APITimeoutError):
        return cls(REQUEST)
    if issubclass(cls, openai.APIConnectionError):
        return cls(request=REQUEST)
    if issubclass(cls, openai.APIResponseValidationError):
        return cls(httpx2.Response(200, request=REQUEST), None)
    try:
        return cls("boom")
    except TypeError:
        error = cls.__new__(cls)
        Exception.__init__(error, "boom")
        return error


def test_the_sdk_exports_the_exceptions_this_module_knows() -> None:
    """Every exception the expectations name is still exported by the installed openai SDK."""
    names = {cls.__name__ for cls in SDK_EXCEPTIONS}
    assert set(EXPECTED_SDK_CATEGORIES) <= names


@pytest.mark.parametrize("cls", SDK_EXCEPTIONS, ids=lambda cls: cls.__name__)
def test_every_sdk_exception_maps_to_its_expected_category(cls: type[BaseException]) -> None:
    """classify gives every exception class the openai SDK exports the category written down for
    it here; a class a new SDK release adds fails until someone decides its category."""
    assert cls.__name__ in EXPECTED_SDK_CATEGORIES, f"{cls.__name__}: which category?"
    assert classify(sdk_error(cls)) == EXPECTED_SDK_CATEGORIES[cls.__name__]


@pytest.mark.parametrize(
    "cls",
    [c for c in SDK_EXCEPTIONS if isinstance(getattr(c, "status_code", None), int)],
    ids=lambda cls: cls.__name__,
)
def test_status_classes_classify_by_their_class_status_without_a_response(
    cls: type[BaseException],
) -> None:
    """A bare APIStatusError subclass instance (``__new__``) is classified by its class status."""
    error = cls.__new__(cls)
    assert classify(error) == category_for_status(cls.status_code)  # type: ignore[attr-defined]


def test_classify_of_plain_python_errors() -> None:
    """Python's own timeouts and connection errors are the network layer; anything else is
    INTERNAL_ERROR."""
    assert classify(TimeoutError()) == C.NETWORK_TIMEOUT
    assert classify(ConnectionResetError()) == C.NETWORK_TIMEOUT
    assert classify(KeyError("x")) == C.INTERNAL_ERROR
    assert classify(ValueError("x")) == C.INTERNAL_ERROR


# --- category_for_status ------------------------------------------------------------------------


def expected_for_status(status: int, downstream: bool) -> Category:
    """The docstring's table, written out independently of the implementation."""
    if status in (401, 403):
        return C.BUSINESS_REJECTED if downstream else C.AUTH_FAILED
    if status == 404 and not downstream:
        return C.CONFIGURATION
    if status == 408:
        return C.NETWORK_TIMEOUT
    if status == 409:
        return C.DUPLICATE_EXECUTION if downstream else C.NETWORK_TIMEOUT
    if status == 429:
        return C.RATE_LIMIT_EXCEEDED
    if 500 <= status <= 599:
        return C.NETWORK_TIMEOUT
    return C.BUSINESS_REJECTED if downstream else C.INPUT_QUALITY_ISSUE


@pytest.mark.parametrize("downstream", [False, True], ids=["llm", "downstream"])
@pytest.mark.parametrize("status", range(400, 600))
def test_category_for_status_matches_the_table(status: int, downstream: bool) -> None:
    """Every HTTP error status maps to the category the docstring table gives it."""
    assert category_for_status(status, downstream=downstream) == expected_for_status(
        status, downstream
    )


@pytest.mark.parametrize("status", [0, 200, 204, 302, 399, 600, 999, -404])
@pytest.mark.parametrize("downstream", [False, True])
def test_category_for_status_rejects_non_error_statuses(status: int, downstream: bool) -> None:
    """A status outside 400..599 is not an error status and raises ValueError."""
    with pytest.raises(ValueError):
        category_for_status(status, downstream=downstream)


# --- the taxonomy table -------------------------------------------------------------------------

EXPECTED_LAYERS = {
    C.NETWORK_TIMEOUT: Layer.NETWORK,
    C.RATE_LIMIT_EXCEEDED: Layer.PROTOCOL,
    C.AUTH_FAILED: Layer.PROTOCOL,
    C.CONFIGURATION: Layer.SETTINGS,
    C.INPUT_QUALITY_ISSUE: Layer.PROTOCOL,
    C.SCHEMA_VIOLATION: Layer.MODEL,
    C.LOW_CONFIDENCE: Layer.MODEL,
    C.MODEL_REFUSAL: Layer.MODEL,
    C.MODEL_HALLUCINATION: Layer.MODEL,
    C.DUPLICATE_EXECUTION: Layer.BUSINESS,
    C.BUSINESS_REJECTED: Layer.BUSINESS,
    C.RUN_INTERRUPTED: Layer.RUNTIME,
    C.DATABASE_UNAVAILABLE: Layer.RUNTIME,
    C.BUDGET_REACHED: Layer.RUNTIME,
    C.INTERNAL_ERROR: Layer.INTERNAL,
}
EXPECTED_DISPOSITIONS = {
    C.NETWORK_TIMEOUT: Disposition.RETRY,
    C.RATE_LIMIT_EXCEEDED: Disposition.RETRY,
    C.AUTH_FAILED: Disposition.FAILED,
    C.CONFIGURATION: Disposition.STOPPED,
    C.INPUT_QUALITY_ISSUE: Disposition.REVIEW,
    C.SCHEMA_VIOLATION: Disposition.REVIEW,
    C.LOW_CONFIDENCE: Disposition.REVIEW,
    C.MODEL_REFUSAL: Disposition.REVIEW,
    C.MODEL_HALLUCINATION: Disposition.QUARANTINED,
    C.DUPLICATE_EXECUTION: Disposition.DONE,
    C.BUSINESS_REJECTED: Disposition.REVIEW,
    C.RUN_INTERRUPTED: Disposition.RETRY,
    C.DATABASE_UNAVAILABLE: Disposition.RETRY,
    C.BUDGET_REACHED: Disposition.RETRY,
    C.INTERNAL_ERROR: Disposition.FAILED,
}
NEEDS_PERSON = {
    C.INPUT_QUALITY_ISSUE,
    C.SCHEMA_VIOLATION,
    C.LOW_CONFIDENCE,
    C.MODEL_REFUSAL,
    C.MODEL_HALLUCINATION,
    C.BUSINESS_REJECTED,
}


def test_every_category_has_a_rule() -> None:
    """The rule table covers exactly the categories, and each category reaches its rule."""
    assert set(RULES) == set(Category)
    assert set(EXPECTED_LAYERS) == set(Category)
    for category in Category:
        assert category.rule is RULES[category]
        assert category.rule.action


@pytest.mark.parametrize("category", list(Category), ids=lambda c: c.value)
def test_taxonomy_row(category: Category) -> None:
    """Each category has the layer, retryability, disposition and needs-a-person of its row."""
    assert category.rule.layer == EXPECTED_LAYERS[category]
    assert category.rule.disposition == EXPECTED_DISPOSITIONS[category]
    retryable = category in (
        C.NETWORK_TIMEOUT,
        C.RATE_LIMIT_EXCEEDED,
        C.RUN_INTERRUPTED,
        C.DATABASE_UNAVAILABLE,
        C.BUDGET_REACHED,
    )
    assert category.retryable is retryable
    assert category.rule.retryable is retryable
    assert category.needs_person is (category in NEEDS_PERSON)
    assert category.stops_run is (category == C.CONFIGURATION)


def test_a_configuration_fault_says_to_fix_the_setting() -> None:
    """CONFIGURATION's row: not retryable as a document's failure, neither reviewed nor dead
    lettered, and its action says the documents stay as they were."""
    rule = C.CONFIGURATION.rule
    assert not rule.retryable
    assert rule.disposition not in (Disposition.REVIEW, Disposition.QUARANTINED)
    assert rule.action.startswith("fix the setting; the documents stay as they were")


@pytest.mark.parametrize(
    ("status", "code", "param", "expected"),
    [
        (400, "unsupported_value", "temperature", C.CONFIGURATION),
        (400, "unsupported_parameter", "max_tokens", C.CONFIGURATION),
        (400, "invalid_request_error", "reasoning_effort", C.CONFIGURATION),
        (400, None, "response_format", C.CONFIGURATION),
        (
            400,
            "missing_required_parameter",
            "response_format.json_schema.name",
            C.CONFIGURATION,
        ),
        (400, None, "model", C.CONFIGURATION),
        (404, "model_not_found", None, C.CONFIGURATION),
        (400, "model_not_found", None, C.CONFIGURATION),
        (404, None, None, C.CONFIGURATION),
        (400, "context_length_exceeded", "messages", C.INPUT_QUALITY_ISSUE),
        (400, None, "messages", C.INPUT_QUALITY_ISSUE),
        (400, None, None, C.INPUT_QUALITY_ISSUE),
        (422, None, None, C.INPUT_QUALITY_ISSUE),
        (401, "invalid_api_key", None, C.AUTH_FAILED),
        (429, "rate_limit_exceeded", None, C.RATE_LIMIT_EXCEEDED),
        (500, None, None, C.NETWORK_TIMEOUT),
    ],
)
def test_category_for_reply_reads_the_code_and_param(
    status: int, code: str | None, param: str | None, expected: Category
) -> None:
    """A 400 that names a request setting, or a model not found, is CONFIGURATION; one about the
    messages stays the document's (INPUT_QUALITY_ISSUE); other statuses follow the status table."""
    assert category_for_reply(status, code=code, param=param) == expected


def test_classify_reads_the_error_object_of_a_400() -> None:
    """The SDK's BadRequestError carries OpenAI's code and param: a refused temperature is
    CONFIGURATION, a prompt too long is INPUT_QUALITY_ISSUE."""
    response = httpx2.Response(400, request=REQUEST)
    refused = {"message": "Unsupported value", "code": "unsupported_value", "param": "temperature"}
    too_long = {"message": "too long", "code": "context_length_exceeded", "param": "messages"}
    assert classify(openai.BadRequestError("x", response=response, body=refused)) == C.CONFIGURATION
    assert (
        classify(openai.BadRequestError("x", response=response, body=too_long))
        == C.INPUT_QUALITY_ISSUE
    )


# --- redaction ----------------------------------------------------------------------------------


def test_redact_removes_registered_secrets() -> None:
    """A registered secret is masked wherever it shows up, even without a credential shape."""
    register_secret("plain-value-Q7x9z")
    out = redact("the key plain-value-Q7x9z was refused; again plain-value-Q7x9z")
    assert "plain-value-Q7x9z" not in out
    assert out == f"the key {MASK} was refused; again {MASK}"


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Incorrect API key provided: sk-proj-AbC123xyz789.", "sk-proj-AbC123xyz789"),
        ("sent Bearer abcdefghijkl0123 to the endpoint", "abcdefghijkl0123"),
        ("api_key=zzzz9999yyyy", "zzzz9999yyyy"),
        ("connect postgresql://ana:hunter2pw@db.local:5432/results", "hunter2pw"),
        ("https://bob:pa55-word@example.com/path", "pa55-word"),
    ],
)
def test_redact_masks_credential_shapes(text: str, secret: str) -> None:
    """sk- keys, Bearer tokens, api_key= values and passwords in URLs are masked."""
    out = redact(text)
    assert secret not in out
    assert MASK in out


def test_redact_keeps_the_user_of_a_url() -> None:
    """Only the password of a URL is masked: user, host and path stay readable."""
    assert redact("postgresql://ana:hunter2pw@db:5432/x") == f"postgresql://ana:{MASK}@db:5432/x"


def test_redact_masks_an_authorization_bearer_header() -> None:
    """The token of an 'Authorization: Bearer <token>' header line is masked."""
    out = redact("Authorization: Bearer abcdefghijkl0123")
    assert "abcdefghijkl0123" not in out


@pytest.mark.parametrize(
    "text",
    [
        "Order 4471 for Harbor Supplies was delivered to Lisbon on time.",
        "See https://example.com/orders?id=12 or mail ana@example.com, task-abcdef1234.",
        "HTTP 503: The engine is currently overloaded. (simulated by fault rule #0)",
        "risk-assessment and desk-research are ordinary words; a key: short",
    ],
)
def test_redact_leaves_ordinary_text_alone(text: str) -> None:
    """Text without credentials comes back unchanged."""
    assert redact(text) == text


# --- credentials --------------------------------------------------------------------------------


def test_refresh_from_a_file(tmp_path: Any) -> None:
    """A key file with a new key replaces the key and bumps the generation."""
    key_file = tmp_path / "key"
    key_file.write_text("  file-key-NEW-1\n")
    creds = Credentials("file-key-OLD-1", key_file=str(key_file))
    assert asyncio.run(creds.refresh(0)) is True
    assert (creds.key, creds.generation) == ("file-key-NEW-1", 1)
    assert redact("leaked file-key-NEW-1") == f"leaked {MASK}"


def test_refresh_from_a_command() -> None:
    """A key command's stripped standard output becomes the new key."""
    creds = Credentials("cmd-key-OLD-1", key_command="printf newkey-from-cmd")
    assert asyncio.run(creds.refresh(0)) is True
    assert (creds.key, creds.generation) == ("newkey-from-cmd", 1)


def test_refresh_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without file or command the environment variable is read again."""
    monkeypatch.setenv("AIP_TEST_FAILURES_KEY", "env-key-NEW-1")
    creds = Credentials("env-key-OLD-1", key_env="AIP_TEST_FAILURES_KEY")
    assert asyncio.run(creds.refresh(0)) is True
    assert (creds.key, creds.generation) == ("env-key-NEW-1", 1)


@pytest.mark.parametrize(
    "source",
    ["same-file", "empty-file", "missing-file", "same-cmd", "failing-cmd", "same-env", "no-env"],
)
def test_refresh_without_a_fresh_key(
    source: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the source holds the same key, nothing, or cannot be read, refresh returns False and
    keeps the key."""
    key = "stale-key-XYZ-1"
    monkeypatch.delenv("AIP_TEST_FAILURES_KEY", raising=False)
    key_file = tmp_path / "key"
    kwargs: dict[str, Any] = {}
    if source == "same-file":
        key_file.write_text(key + "\n")
        kwargs["key_file"] = str(key_file)
    elif source == "empty-file":
        key_file.write_text("  \n")
        kwargs["key_file"] = str(key_file)
    elif source == "missing-file":
        kwargs["key_file"] = str(tmp_path / "absent")
    elif source == "same-cmd":
        kwargs["key_command"] = f"printf {key}"
    elif source == "failing-cmd":
        kwargs["key_command"] = "false"
    elif source == "same-env":
        monkeypatch.setenv("AIP_TEST_FAILURES_KEY", key)
        kwargs["key_env"] = "AIP_TEST_FAILURES_KEY"
    else:
        kwargs["key_env"] = "AIP_TEST_FAILURES_KEY"
    creds = Credentials(key, **kwargs)
    assert asyncio.run(creds.refresh(0)) is False
    assert (creds.key, creds.generation) == (key, 0)


def test_a_stale_generation_does_not_read_the_source_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refresh for a generation another call already replaced returns True without a read."""
    key_file = tmp_path / "key"
    key_file.write_text("gen-key-NEW-1")
    creds = Credentials("gen-key-OLD-1", key_file=str(key_file))
    reads: list[str | None] = []
    original = Credentials.read_source

    def counting(self: Credentials) -> str | None:
        value = original(self)
        reads.append(value)
        return value

    monkeypatch.setattr(Credentials, "read_source", counting)

    async def both() -> tuple[bool, bool]:
        return await creds.refresh(0), await creds.refresh(0)

    assert asyncio.run(both()) == (True, True)
    assert reads == ["gen-key-NEW-1"]
    assert creds.generation == 1


# --- the requests-per-minute limiter ------------------------------------------------------------


def test_rate_limiter_waits_until_the_oldest_request_is_a_minute_old() -> None:
    """With 3 per minute, the 4th acquire sleeps until the first one is 60 s old."""
    fake = FakeTime(start=1000.0)
    limiter = RateLimiter(3, clock=fake.clock, sleep=fake.sleep)

    async def run() -> None:
        await limiter.acquire()  # t=1000
        fake.now += 10
        await limiter.acquire()  # t=1010
        fake.now += 10
        await limiter.acquire()  # t=1020
        assert fake.sleeps == []
        fake.now += 10
        await limiter.acquire()  # t=1030: waits until 1060
        assert fake.sleeps == [30.0]
        assert fake.now == 1060.0
        await limiter.acquire()  # the window is now 1010, 1020, 1060: waits until 1070
        assert fake.sleeps == [30.0, 10.0]

    asyncio.run(run())


def test_rate_limiter_without_a_limit_never_waits() -> None:
    """per_minute None means no limit: a hundred acquires, no sleep."""
    fake = FakeTime(start=1000.0)
    limiter = RateLimiter(None, clock=fake.clock, sleep=fake.sleep)

    async def run() -> None:
        for _ in range(100):
            await limiter.acquire()

    asyncio.run(run())
    assert fake.sleeps == []
