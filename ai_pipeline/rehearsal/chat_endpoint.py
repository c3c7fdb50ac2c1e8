"""What the simulator's chat endpoint answers: a chat request — synchronous, or one line of a
batch — read, admitted (choosing the fault rule that hits it), refused in OpenAI rules mode or by
the models served, or answered with the model's reply within its limit and its usage; and the
error bodies OpenAI gives for each status. The HTTP routes around it are
:mod:`.simulator`'s."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ai_pipeline.rehearsal import openai_rules
from ai_pipeline.rehearsal.analysis import estimate_tokens
from ai_pipeline.rehearsal.faults import CONTENT_FAULTS, SimulatorConfig, SimulatorState, _Admission
from ai_pipeline.rehearsal.replies import (
    ChatRequest,
    Reply,
    completion_tokens,
    compose_reply,
    cut_to,
    message_text,
    parse_chat_request,
)
from ai_pipeline.rehearsal.serving import retry_after_header


def error_body(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


_STATUS_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "The request was invalid."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("permission_error", "permission_denied", "You are not allowed to use this model."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    409: ("invalid_request_error", "conflict", "The request conflicts with another request."),
    422: ("invalid_request_error", "unprocessable_entity", "The request could not be processed."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    500: ("server_error", None, "The server had an error while processing your request."),
    502: ("server_error", "bad_gateway", "Bad gateway."),
    503: ("server_error", "service_unavailable", "The engine is currently overloaded."),
    504: ("server_error", "gateway_timeout", "The upstream server timed out."),
}


@dataclass(frozen=True)
class ChatAnswer:
    """A chat request's answer: its status and body (status None: the connection is dropped)."""

    status: int | None
    body: dict[str, Any] | None
    headers: dict[str, str] = field(default_factory=dict)


def status_answer(status: int, note: str, headers: dict[str, str] | None = None) -> ChatAnswer:
    default_type = "server_error" if status >= 500 else "invalid_request_error"
    type_, code, message = _STATUS_ERRORS.get(status, (default_type, None, "Request failed."))
    return ChatAnswer(status, error_body(f"{message} ({note})", type_, code), dict(headers or {}))


def _within_limit(reply: Reply, thinking: int, limit: int | None) -> tuple[Reply, int]:
    """The reply and its reasoning tokens within the request's limit on completion tokens.

    As a real endpoint does, the reply stops at the limit (``finish_reason: "length"``); a
    reasoning model's thought counts first, and when it takes the whole limit nothing is said.
    """
    if limit is None or reply.content is None:
        return reply, thinking
    if thinking >= limit:
        return replace(reply, content="", finish_reason="length"), limit
    if estimate_tokens(reply.content) > limit - thinking:
        cut = cut_to(reply.content, limit - thinking)
        return replace(reply, content=cut, finish_reason="length"), thinking
    return reply, thinking


class ChatEndpoint:
    """Answers the chat requests of one simulator: the synchronous endpoint's, and each line of
    a batch, the same way."""

    def __init__(self, config: SimulatorConfig, state: SimulatorState) -> None:
        self.config = config
        self.state = state
        self.served = config.served_models

    def refused(self, chat: ChatRequest) -> openai_rules.RequestError | None:
        """What OpenAI rules mode, or the list of models self.served, refuses in this request."""
        model, suffix = chat.model, self.config.served_model_suffix
        tokens = estimate_tokens(chat.text) if chat.text is not None else 0
        if self.config.context_tokens is not None and tokens > self.config.context_tokens:
            return openai_rules.RequestError(
                400,
                f"This model's maximum context length is {self.config.context_tokens} tokens. "
                f"However, your messages resulted in {tokens} tokens. Please reduce the length "
                "of the messages.",
                "messages",
                "context_length_exceeded",
            )
        if (
            model is not None
            and self.served is not None
            and not openai_rules.serves(model, self.served, suffix)
        ):
            return openai_rules.model_error(model)
        return (
            openai_rules.check_request(chat.body, chat.messages)
            if self.config.openai_rules
            else None
        )

    async def answer_chat(
        self,
        key: str,
        authorized: bool,
        chat: ChatRequest,
        rules_error: openai_rules.RequestError | None,
        admission: _Admission,
        *,
        stall: Callable[[], Awaitable[None]] | None,
        batch: bool = False,
    ) -> ChatAnswer:
        """What a chat request is answered, once admitted: the one answer of both the
        synchronous endpoint and each line of a batch. ``stall`` is how a timeout fault holds
        the request (None: it fails as a gateway timeout instead, as nobody waits on a line)."""
        record, rule = admission.record, admission.rule
        note = f"simulated by fault rule #{admission.rule_index}"
        if not authorized:
            self.state.finish(record, 401)
            return status_answer(401, "the simulator does not accept this key")
        if chat.error is not None or chat.text is None:
            self.state.finish(record, 400)
            body = error_body(chat.error or "Bad request.", "invalid_request_error", None)
            return ChatAnswer(400, body)
        if rules_error is not None:
            self.state.finish(record, rules_error.status)
            return ChatAnswer(rules_error.status, rules_error.body())
        fault_header = {"x-simulator-fault": rule.kind} if rule else {}
        if rule is not None and rule.kind == "status":
            headers = dict(fault_header)
            if rule.retry_after is not None:
                headers["retry-after"] = retry_after_header(rule.retry_after)
            self.state.finish(record, rule.status)
            return status_answer(rule.status, note, headers)
        if rule is not None and rule.kind == "reset":
            self.state.finish(record, None)
            return ChatAnswer(None, None, fault_header)
        if rule is not None and rule.kind == "expire" and stall is None:
            # A line the batch never reaches before its window closes.
            self.state.finish(record, "expired")
            return ChatAnswer(None, None, fault_header)
        if rule is not None and rule.kind in ("timeout", "expire"):
            if stall is None:
                self.state.finish(record, 504)
                return status_answer(504, note, fault_header)
            await stall()

        fault = rule.kind if rule is not None and rule.kind in CONTENT_FAULTS else None
        reply = compose_reply(chat.text, chat.schema, fault)
        thinking = 0
        if self.config.openai_rules and chat.model and openai_rules.is_reasoning_model(chat.model):
            thinking = openai_rules.reasoning_tokens(chat.text)
        reply, thinking = _within_limit(reply, thinking, chat.max_tokens)
        self.state.finish(record, 200, reply.builtin_fault)
        with_usage = rule is None or rule.kind != "no_usage"
        body, request_id = self._completion(key, chat, reply, thinking, with_usage, batch)
        return ChatAnswer(200, body, {"x-request-id": request_id, **fault_header})

    def admit_chat(
        self, key: str, authorized: bool, raw: bytes, *, batch: bool = False
    ) -> tuple[ChatRequest, openai_rules.RequestError | None, _Admission]:
        """Read a chat request and count its arrival (choosing the fault rule that hits it)."""
        chat = parse_chat_request(raw)
        rules_error = self.refused(chat) if chat.error is None else None
        # A refused request reaches no model: no fault rule is spent on it.
        text = chat.text if rules_error is None else None
        return (
            chat,
            rules_error,
            self.state.admit(key, authorized, text, chat.max_tokens, batch=batch),
        )

    async def answer_line(self, custom_id: str, raw: bytes) -> ChatAnswer:
        """One line of a batch, answered as the synchronous endpoint answers its body."""
        chat, rules_error, admission = self.admit_chat(custom_id, True, raw, batch=True)
        answer = await self.answer_chat(
            custom_id, True, chat, rules_error, admission, stall=None, batch=True
        )
        if answer.status is None and answer.headers.get("x-simulator-fault") == "reset":
            # A dropped connection, for a line: the server's error.
            return status_answer(500, "the connection was reset", answer.headers)
        return answer

    def _completion(
        self,
        key: str,
        chat: ChatRequest,
        reply: Reply,
        thinking: int,
        with_usage: bool,
        batch: bool,
    ) -> tuple[dict[str, Any], str]:
        said = [(str(m.get("role", "")), message_text(m.get("content"))) for m in chat.messages]
        prompt_tokens = sum(estimate_tokens(text) for _, text in said)
        completion = completion_tokens(reply) + thinking
        self.state.add_usage(key, prompt_tokens + completion, batch=batch)
        request_id = uuid.uuid4().hex
        model = chat.model or self.config.model
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }
        if self.config.caches_prompts:
            cached = self.state.prompt_cache.cached_tokens(model, said)
            usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        if self.config.openai_rules:
            usage["completion_tokens_details"] = {
                "reasoning_tokens": thinking,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            }
        message = {"role": "assistant", "content": reply.content, "refusal": reply.refusal}
        body = {
            "id": f"chatcmpl-sim-{request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model + self.config.served_model_suffix,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": reply.finish_reason,
                }
            ],
            **({"usage": usage} if with_usage else {}),
        }
        return body, request_id
