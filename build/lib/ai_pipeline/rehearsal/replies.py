"""What a chat request asks of the simulator, and what its model replies, faults included.

:func:`parse_chat_request` reads a ``/v1/chat/completions`` body into a :class:`ChatRequest`
(the document between the prompt's markers, the reply's token limit, the schema of a
``json_schema`` response format); :func:`compose_reply` says what the model answers: the
analysis of :mod:`.analysis` as a JSON object (no response format, or ``json_object``), an answer
conforming to the request's schema (:mod:`.schema_answer`), or either spoilt by a content fault.

How each content fault spoils a schema answer (the built-in analysis as a schema is spoilt
exactly as in JSON mode):

* ``refuse``, and a document asking for "I don't know": no content, the text in the message's
  ``refusal`` field, as OpenAI answers a refused Structured Outputs request;
* ``truncate``: the first half of the JSON, ``finish_reason: "length"``; ``invalid_json``: the JSON
  wrapped in a sentence of prose;
* ``missing_field``: ``summary`` left out, or else the first property;
* ``wrong_type``: ``confidence`` (or else the first number, or else the first property) given a
  value of the wrong type ("high", or 42 where a string belongs);
* ``low_confidence``: ``confidence`` (or else the first confidence-like number, or else the first
  number) set to 0.42; an answer without numbers is left as it is;
* ``hallucinate``: two names the text never mentions added to ``entities`` or else to the first
  array of plain strings met depth first (:func:`.schema_answer.string_list_slot`), its last
  items making room within ``maxItems``; without such an array the first string property of the
  answer becomes the invented name.

Only the top-level properties are left out, retyped or set low: that is where a pipeline's checks
look first, and what the JSON-mode faults do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ai_pipeline.rehearsal.analysis import analyse, dont_know_reply, estimate_tokens, is_chinese
from ai_pipeline.rehearsal.schema_answer import answer_for_schema, string_list_slot
from ai_pipeline.rehearsal.schema_source import CONFIDENCE_WORDS, name_words

# The markers a prompt puts around the document (any server may look for them; this one does, to
# analyse the document rather than the instructions). ``Declaration.messages`` writes them.
DOCUMENT_START = "<<<DOCUMENT"
DOCUMENT_END = "DOCUMENT>>>"
HALLUCINATED_ENTITIES = ("Globex Corporation", "Dr. Nora Vance", "Initech Holdings", "Lars Vinter")


def extract_document(user_content: str) -> str:
    """The document text of a user message built with the markers (or the whole message)."""
    start = user_content.find(DOCUMENT_START)
    end = user_content.rfind(DOCUMENT_END)
    if start == -1 or end == -1 or end < start:
        return user_content
    return user_content[start + len(DOCUMENT_START) : end].strip("\n")


def message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": ...}, ...]
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion request as the simulator reads it; ``error`` when it cannot be read."""

    body: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int | None = None
    text: str | None = None
    error: str | None = None

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON schema of a ``json_schema`` response format (None for any other)."""
        response_format = self.body.get("response_format")
        if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
            return None
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        return schema if isinstance(schema, dict) else None


def parse_chat_request(raw: bytes) -> ChatRequest:
    try:
        body = json.loads(raw)
    except ValueError:
        return ChatRequest(error="The request body is not valid JSON.")
    if not isinstance(body, dict):
        return ChatRequest(error="The request body must be a JSON object.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        return ChatRequest(error="'messages' must be a list of message objects.")
    if body.get("stream"):
        return ChatRequest(error="The simulator does not support stream=true.")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        return ChatRequest(error="'max_tokens' must be a positive integer.")
    model = body.get("model")
    text = next(
        (
            extract_document(message_text(m.get("content")))
            for m in reversed(messages)
            if m.get("role") == "user"
        ),
        None,
    )
    return ChatRequest(
        body=body,
        model=model if isinstance(model, str) and model else None,
        messages=messages,
        max_tokens=limit,
        text=text,
        error=None if text is not None else "The request has no user message.",
    )


def cut_to(content: str, max_tokens: int) -> str:
    """The longest start of ``content`` within ``max_tokens`` (as the simulator counts)."""
    while content and estimate_tokens(content) > max_tokens:
        shorter = len(content) * max_tokens // estimate_tokens(content)
        content = content[: min(shorter, len(content) - 1)]
    return content


@dataclass(frozen=True)
class Reply:
    """What the model says: ``content``, or ``refusal`` (Structured Outputs' refusals)."""

    content: str | None
    refusal: str | None = None
    finish_reason: str = "stop"
    builtin_fault: str | None = None  # "dont_know" when the document asked for that reply


def compose_reply(text: str, schema: dict[str, Any] | None, fault: str | None) -> Reply:
    """The model's reply to ``text``, spoilt by the content fault ``fault`` if one is given."""
    if fault is not None:
        if fault == "refuse" and schema is not None:
            return Reply(None, refusal=_refusal(text))
        content = _faulty_content(fault, text, schema)
        if fault == "truncate":
            return Reply(content[: len(content) // 2], finish_reason="length")
        return Reply(content)
    # A configured fault wins over the built-in refusal: it is what the user asked for.
    refusal = dont_know_reply(text)
    if refusal is not None:
        if schema is not None:
            return Reply(None, refusal=refusal, builtin_fault="dont_know")
        return Reply(refusal, builtin_fault="dont_know")
    answer = analyse(text) if schema is None else answer_for_schema(schema, text)
    return Reply(json.dumps(answer, ensure_ascii=False))


def _refusal(text: str) -> str:
    if is_chinese(text):
        return "抱歉，我无法回答这个问题。"
    return "I'm sorry, but I can't help with that request."


def _faulty_content(kind: str, text: str, schema: dict[str, Any] | None) -> str:
    if kind == "refuse":
        return _refusal(text)
    result = analyse(text) if schema is None else answer_for_schema(schema, text)
    if isinstance(result, dict):
        _spoil(kind, result, text, schema)
    content = json.dumps(result, ensure_ascii=False)
    if kind == "invalid_json":
        if is_chinese(text):
            return f"好的！以下是分析结果：{content} 希望对你有帮助！"
        return f"Sure! Here is the analysis: {content} Hope this helps!"
    return content


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _spoil(kind: str, result: dict[str, Any], text: str, schema: dict[str, Any] | None) -> None:
    numbers = [key for key, value in result.items() if _is_number(value)]
    if kind == "missing_field" and result:
        result.pop("summary" if "summary" in result else next(iter(result)))
    elif kind == "wrong_type" and result:
        key = "confidence" if "confidence" in result else (numbers or list(result))[0]
        result[key] = 42 if isinstance(result[key], str) else "high"
    elif kind == "low_confidence":
        liked = [key for key in numbers if name_words(key) & CONFIDENCE_WORDS]
        chosen = ["confidence"] if "confidence" in result else liked or numbers
        if chosen:
            result[chosen[0]] = 0.42
    elif kind == "hallucinate":
        invented = [name for name in HALLUCINATED_ENTITIES if name not in text][:2]
        slot = string_list_slot(schema, result) if schema is not None else (result, "entities", 0)
        if slot is None:
            strings = [key for key, value in result.items() if isinstance(value, str)]
            if strings:
                result[strings[0]] = invented[0]
            return
        holder, key, most = slot
        items = list(holder.get(key, []))
        if schema is None:  # JSON mode: the entities list has no limit
            most = len(items) + len(invented)
        holder[key] = [*items[: max(most - len(invented), 0)], *invented][:most]


def completion_tokens(reply: Reply) -> int:
    """The tokens of what the model said (its content, or its refusal)."""
    return estimate_tokens(reply.content or reply.refusal or "")
