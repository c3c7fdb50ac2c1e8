"""A run storage that is not SQL, as Dagster+'s is not: Dagster's SQLite run storage seen through
the ``RunStorage`` interface alone, with no ``connect()`` and no table to reach.

``dagster.yaml`` names it as ``run_storage`` (``opaque_run_storage_yaml``); the product must take
the paths that need nothing more (``ai_pipeline.defs.acceleration``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagster import StringSource
from dagster._core.storage.runs.base import RunStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._serdes import ConfigurableClass, ConfigurableClassData


class OpaqueRunStorage(RunStorage, ConfigurableClass):
    """Every method of the interface, answered by a SQLite run storage it holds out of reach."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._runs = SqliteRunStorage.from_local(base_dir)
        self._inst_data = inst_data
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> Any:
        return {"base_dir": StringSource}

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Any
    ) -> OpaqueRunStorage:
        return cls(config_value["base_dir"], inst_data)

    def register_instance(self, instance: Any) -> None:
        super().register_instance(instance)
        self._runs.register_instance(instance)

    def dispose(self) -> None:
        self._runs.dispose()


def _forwarded(name: str) -> Callable[..., Any]:
    def method(self: OpaqueRunStorage, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._runs, name)(*args, **kwargs)

    method.__name__ = name
    return method


def _forwarded_property(name: str) -> property:
    return property(lambda self: getattr(self._runs, name))


# The interface: every public method and property of ``RunStorage`` (its daemon cursors
# included), but what the class above defines itself.
for _name in dir(RunStorage):
    if _name.startswith("_") or _name in OpaqueRunStorage.__dict__ or _name in ("inst_data",):
        continue
    _attribute = getattr(RunStorage, _name)
    if isinstance(_attribute, property):
        setattr(OpaqueRunStorage, _name, _forwarded_property(_name))
    elif callable(_attribute) and not isinstance(
        RunStorage.__dict__.get(_name), (classmethod, staticmethod)
    ):
        setattr(OpaqueRunStorage, _name, _forwarded(_name))
OpaqueRunStorage.__abstractmethods__ = frozenset()


def opaque_run_storage_yaml(home: Path) -> str:
    """The ``run_storage`` section that puts an instance's runs in this storage."""
    return (
        "run_storage:\n"
        f"  module: {__name__}\n"
        f"  class: {OpaqueRunStorage.__name__}\n"
        "  config:\n"
        f"    base_dir: {home / 'history'}\n"
    )
