"""Configuration faults at the LLM client: a model the endpoint does not have, a parameter the
model refuses, an address where nothing listens. Each opens the circuit at the first reply, with a
message naming the setting; an outage that is not a wrong address stays NETWORK_TIMEOUT. The
openai SDK over real HTTP against the simulator in OpenAI rules mode; only sleeping is faked."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ai_pipeline.analyses import DOCUMENT_ANALYSIS
from ai_pipeline.declaration import ModelSettings
from ai_pipeline.failures import Category, ClassifiedError
from ai_pipeline.llm import LLMClient
from ai_pipeline.rehearsal.faults import SimulatorConfig
from ai_pipeline.rehearsal.simulator import SimulatorServer
from ai_pipeline_tests.support import TEST_API_KEY, FakeTime, RecordingLog, sample_text

MESSAGES = DOCUMENT_ANALYSIS.messages(sample_text(3))
SERVED = ("gpt-4o-mini", "gpt-5-mini")


@pytest.fixture(scope="module")
def openai_like() -> Iterator[SimulatorServer]:
    """A simulator that answers as OpenAI does, serving only ``SERVED``."""
    with SimulatorServer(SimulatorConfig(openai_rules=True, models=SERVED)) as server:
        yield server


def closed_port() -> int:
    """A local port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def analyse_all(
    base_url: str, model: str, n: int, *, settings: ModelSettings | None = None, **kw: Any
) -> tuple[list[Any], LLMClient, FakeTime, RecordingLog]:
    """``n`` calls at once through one client (concurrency 4); their results or errors."""
    fake, log = FakeTime(), RecordingLog()
    box: list[LLMClient] = []

    async def go() -> list[Any]:
        client = LLMClient(
            base_url=base_url,
            api_key=TEST_API_KEY,
            model=model,
            max_concurrency=4,
            sleep=fake.sleep,
            clock=fake.clock,
            **kw,
        )
        box.append(client)
        try:
            tids = [f"task-cfg-{uuid.uuid4().hex[:12]}" for _ in range(n)]
            return list(
                await asyncio.gather(
                    *(client.analyse(t, MESSAGES, settings=settings, log=log) for t in tids),
                    return_exceptions=True,
                )
            )
        finally:
            await client.aclose()

    return asyncio.run(go()), box[0], fake, log


def test_a_model_the_endpoint_does_not_have_stops_the_run_at_its_first_reply(
    openai_like: SimulatorServer,
) -> None:
    """A misspelt model: 8 calls at once cost one request (404 model_not_found), every call is
    CONFIGURATION, and the message names the model and the setting to check."""
    openai_like.reset()
    results, client, fake, log = analyse_all(openai_like.base_url, "gpt-4o-mnii", 8)
    assert all(isinstance(r, ClassifiedError) for r in results), results
    assert {r.category for r in results} == {Category.CONFIGURATION}
    assert openai_like.stats()["total"] == 1
    assert client.circuit is not None and client.circuit.category == Category.CONFIGURATION
    message = client.circuit.message
    assert "the endpoint has no model 'gpt-4o-mnii' (404 model_not_found)" in message
    assert "check AI_PIPELINE_MODEL" in message
    assert fake.sleeps == []
    assert any(line.startswith("[CIRCUIT for TASK:") for line in log.errors)


def test_a_parameter_the_model_refuses_names_the_parameter_and_its_value(
    openai_like: SimulatorServer,
) -> None:
    """A temperature sent to a reasoning model: 400 unsupported_value is CONFIGURATION after one
    request, its message says which model refused which value."""
    openai_like.reset()
    settings = ModelSettings(temperature=0.0, send_temperature=True)
    results, client, _, _ = analyse_all(openai_like.base_url, "gpt-5-mini", 5, settings=settings)
    assert {r.category for r in results} == {Category.CONFIGURATION}
    assert openai_like.stats()["total"] == 1
    assert client.circuit is not None
    assert client.circuit.message.startswith(
        "the model gpt-5-mini does not accept temperature=0.0 (400 unsupported_value: Unsupported value"
    )


def test_an_address_where_nothing_listens_is_configuration() -> None:
    """Connection refused on every attempt of a run that never had an answer: CONFIGURATION
    naming the address, after the one call's network retries, and the other calls are not
    sent."""
    base_url = f"http://127.0.0.1:{closed_port()}/v1"
    results, client, fake, _ = analyse_all(base_url, "gpt-4o-mini", 6)
    assert {r.category for r in results} == {Category.CONFIGURATION}
    assert fake.sleeps == [1.0, 2.0]  # one call, retried twice: then the circuit is open
    assert client.circuit is not None
    assert client.circuit.message.startswith(f"nothing answers at {base_url}")
    assert "OPENAI_BASE_URL" in client.circuit.message


def test_a_refused_connection_after_an_answer_stays_a_network_fault() -> None:
    """An endpoint that answered once and then goes away is an outage, not a wrong address:
    NETWORK_TIMEOUT, and no circuit."""
    fake, log = FakeTime(), RecordingLog()
    server = SimulatorServer(SimulatorConfig(openai_rules=True, models=SERVED))
    server.start()

    async def go() -> tuple[Any, LLMClient]:
        client = LLMClient(
            base_url=server.base_url,
            api_key=TEST_API_KEY,
            model="gpt-4o-mini",
            sleep=fake.sleep,
            clock=fake.clock,
        )
        try:
            await client.analyse("task-cfg-up", MESSAGES, log=log)
            server.stop()
            with pytest.raises(ClassifiedError) as info:
                await client.analyse("task-cfg-gone", MESSAGES, log=log)
            return info.value, client
        finally:
            await client.aclose()

    try:
        error, client = asyncio.run(go())
    finally:
        server.stop()
    assert error.category == Category.NETWORK_TIMEOUT
    assert not client.circuit_open


def test_a_timeout_stays_a_network_fault_even_before_any_answer() -> None:
    """A first call that times out (the endpoint is slow, not absent) is NETWORK_TIMEOUT."""
    with SimulatorServer(SimulatorConfig(hang_seconds=2)) as server:
        server.set_faults([{"kind": "timeout"}])
        results, client, _, _ = analyse_all(
            server.base_url, "sim-analyst-1", 1, timeout_seconds=0.3
        )
    assert [r.category for r in results] == [Category.NETWORK_TIMEOUT]
    assert not client.circuit_open
