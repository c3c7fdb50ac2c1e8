"""Driving an LLM simulator that runs in another process, over its ``/_sim/`` control API
(stats, reset, faults, api-keys, batch-timing). The simulator itself is :mod:`.simulator`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

from ai_pipeline.rehearsal.faults import FaultRule


class SimulatorControl:
    """Drive a simulator in another process over its ``/_sim/`` control API."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        root = base_url.rstrip("/")
        self.root_url = root.removesuffix("/v1")
        self.timeout = timeout

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        with httpx.Client(timeout=self.timeout) as client:
            response = client.request(method, f"{self.root_url}/_sim/{path}", json=payload)
        if response.status_code == 400:
            raise ValueError(response.json().get("error", {}).get("message", response.text))
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "stats")  # type: ignore[no-any-return]

    def requests_for(self, key: str) -> int:
        return int(self.stats()["by_key"].get(key, 0))

    def reset(self) -> None:
        self._call("POST", "reset")

    def faults(self) -> dict[str, Any]:
        return self._call("GET", "faults")  # type: ignore[no-any-return]

    def set_faults(self, faults: Iterable[FaultRule | dict[str, Any]]) -> None:
        # Validate here too, so a typo fails with the same ValueError as in-process.
        rules = [FaultRule.coerce(rule).as_dict() for rule in faults]
        self._call("POST", "faults", {"faults": rules})

    def set_api_keys(self, keys: Iterable[str] | None) -> None:
        self._call("POST", "api-keys", {"api_keys": None if keys is None else sorted(keys)})

    def calls_to(self, endpoint: str) -> int:
        return int(self.stats()["by_endpoint"].get(endpoint, 0))

    def set_batch_timing(
        self,
        *,
        seconds: float | None = None,
        window_seconds: float | None = None,
        cancel_seconds: float | None = None,
    ) -> None:
        timing: dict[str, float | None] = {"window_seconds": window_seconds}
        if seconds is not None:
            timing["seconds"] = seconds
        if cancel_seconds is not None:
            timing["cancel_seconds"] = cancel_seconds
        self._call("POST", "batch-timing", timing)
