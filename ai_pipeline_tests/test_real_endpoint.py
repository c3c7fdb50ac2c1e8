"""The product against a server nobody on the project wrote: llama.cpp's ``llama-server`` with
SmolLM2-135M-Instruct (``ai_pipeline_tests.llama_server``), started once for the module.

The assertions are about categories, never about the quality of a 135M model: every request is
accepted, every reply parses against the output model and stays within the limit it was sent,
and each document either completes or fails in a category its output checks decided.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ai_pipeline.analyses import DOCUMENT_ANALYSIS
from ai_pipeline.endpoints import request_parameters
from ai_pipeline.failures import Category
from ai_pipeline.store.spend import ANSWER
from ai_pipeline_tests.llama_server import (
    MODEL_ALIAS,
    CannotRunHere,
    LlamaServer,
    unavailable_reason,
)
from ai_pipeline_tests.postgres import skip_or_fail
from ai_pipeline_tests.support import EXAMPLES, REPO, results_store

# Short samples, so the module stays within a few minutes on two shared cores: two support
# tickets (one in Chinese) and a news item, and a third ticket.
SAMPLES = (
    "support-ticket-damaged-delivery-zh.txt",
    "support-ticket-refund-delay.txt",
    "support-ticket-password-reset-thanks.txt",
    "news-harbour-bridge-reopening.txt",
)
CONCURRENCY = 2
# What the output checks decide about a reply that parsed: the model layer of the taxonomy.
CHECKED = {Category.LOW_CONFIDENCE, Category.MODEL_HALLUCINATION, Category.MODEL_REFUSAL}


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """A ``llama-server`` decoding ``CONCURRENCY`` requests at once; stopped and reaped after
    the module, whatever its tests did."""
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    server = LlamaServer(tmp_path_factory.mktemp("llama") / "llama-server.log", slots=CONCURRENCY)
    try:
        server.start()
    except CannotRunHere as e:
        server.stop()
        pytest.skip(str(e))
    except BaseException:
        server.stop()
        raise
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.realmodel
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_document_analysis_against_llama_server(
    llama_server: LlamaServer, dagster_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ai-pipeline run --json`` with the built-in analysis as shipped against llama-server:
    no request is refused, no reply breaks the schema or its output limit, and every document
    completes or fails in a category its output checks decided."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for name in SAMPLES:
        shutil.copy(EXAMPLES / "inbox" / name, inbox / name)
    monkeypatch.setenv("OPENAI_BASE_URL", llama_server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "no-key")  # llama-server started without --api-key
    monkeypatch.setenv("AI_PIPELINE_MODEL", MODEL_ALIAS)
    monkeypatch.setenv("AI_PIPELINE_LLM_CONCURRENCY", str(CONCURRENCY))
    # The CPU is shared with the rest of the suite: a reply may take far longer than on an idle
    # machine, and a timeout here would say nothing about the endpoint.
    monkeypatch.setenv("AI_PIPELINE_LLM_TIMEOUT", "240")
    monkeypatch.delenv("AI_PIPELINE_ANALYSIS", raising=False)

    result = subprocess.run(
        [sys.executable, "-m", "ai_pipeline.cli", "run", "--inbox", str(inbox), "--json"],
        cwd=REPO,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode in (0, 1), result.stderr[-3000:]  # 1: a document failed
    report = json.loads(result.stdout)
    documents = report["documents"]
    outcomes = {d["document_id"]: (d["state"], d["category"]) for d in documents}
    assert len(outcomes) == len(SAMPLES), report
    for state, category in outcomes.values():
        assert state == "COMPLETED" or Category(category) in CHECKED, (outcomes, report)

    store = results_store()
    attempts = store.spend.attempts(outcomes)
    failures = [f.category for f in store.events.failures()]
    # One request per document (each sample is one section), each answered with its usage.
    assert len(attempts) == len(SAMPLES), attempts
    assert {a["outcome"] for a in attempts} == {ANSWER}, attempts
    assert {a["model"] for a in attempts} == {MODEL_ALIAS}
    never = {Category.SCHEMA_VIOLATION, Category.INPUT_QUALITY_ISSUE, Category.NETWORK_TIMEOUT}
    assert not never & {Category(c) for c in failures}, failures
    # The output limit under the parameter name this model's family takes, as the request sent it.
    (limit,) = (
        v
        for k, v in request_parameters(
            MODEL_ALIAS,
            temperature=None,
            max_output_tokens=DOCUMENT_ANALYSIS.model.max_output_tokens,
        ).items()
        if k in ("max_tokens", "max_completion_tokens")
    )
    for attempt in attempts:
        assert 0 < attempt["completion_tokens"] <= limit, attempt
        assert attempt["prompt_tokens"] > 0, attempt
    for document in documents:
        if document["state"] == "COMPLETED":
            DOCUMENT_ANALYSIS.document_model.model_validate(document["output"])
    print(json.dumps({"outcomes": list(outcomes.values()), "attempts": attempts}, default=str))


@pytest.mark.slow
@pytest.mark.realmodel
def test_llama_server_enforces_a_strict_schema_but_not_json_mode(llama_server: LlamaServer) -> None:
    """Why requests carry Structured Outputs: llama-server (without ``--no-jinja``) ignores
    ``response_format: json_object`` and answers a request that does not ask for JSON in prose,
    while the same request with the built-in analysis's strict schema comes back as an object
    that passes the schema check."""
    import openai

    client = openai.OpenAI(base_url=llama_server.base_url, api_key="no-key", max_retries=0)
    messages = [{"role": "user", "content": "Say hello to Ana in one short sentence."}]
    common = {"model": MODEL_ALIAS, "messages": messages, "temperature": 0.0, "seed": 1}

    mode = client.chat.completions.create(
        **common, response_format={"type": "json_object"}, max_tokens=40
    )
    prose = mode.choices[0].message.content or ""
    with pytest.raises(ValueError):
        json.loads(prose)

    schema = client.chat.completions.create(
        **common, response_format=DOCUMENT_ANALYSIS.response_format(), max_tokens=4096
    )
    assert schema.choices[0].finish_reason == "stop", schema
    # The grammar holds every string and list to its bounds; a number it cannot bound (a
    # confidence of -10) is the confidence check's to judge, so the schema check passes.
    verdict = DOCUMENT_ANALYSIS.evaluate(schema.choices[0].message.content or "", "")
    assert ("schema", True) in [(o.name, o.passed) for o in verdict.outcomes], verdict
