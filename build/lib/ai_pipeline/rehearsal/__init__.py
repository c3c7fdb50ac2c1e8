"""Rehearsal tools: the OpenAI-compatible LLM simulator and a reference idempotent webhook receiver.

They stand in for the outside world (an LLM endpoint, a downstream that honours
``Idempotency-Key``) so that the demo and the tests exercise the real openai SDK and real HTTP with
no network, and so that teams can rehearse failures. Nothing here imports the pipeline: they speak
only HTTP, as any real endpoint would.
"""
