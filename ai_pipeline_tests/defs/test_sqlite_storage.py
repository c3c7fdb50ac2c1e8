"""The embedded default's event log keeps the keys of dynamic partitions, and stays exact: keys
added or deleted through another storage (another process) are seen at the next read."""

from __future__ import annotations

from pathlib import Path

from ai_pipeline.defs.sqlite_storage import EngineReusingSqliteEventLogStorage


def test_dynamic_partition_keys_follow_every_writer(tmp_path: Path) -> None:
    reader = EngineReusingSqliteEventLogStorage(str(tmp_path))
    writer = EngineReusingSqliteEventLogStorage(str(tmp_path))  # as another process would
    assert reader.get_dynamic_partitions("documents") == []
    writer.add_dynamic_partitions("documents", ["a", "b", "c"])
    writer.add_dynamic_partitions("other", ["x"])
    assert reader.get_dynamic_partitions("documents") == ["a", "b", "c"]
    writer.add_dynamic_partitions("documents", ["d", "b"])  # "b" is there already
    assert reader.get_dynamic_partitions("documents") == ["a", "b", "c", "d"]
    writer.delete_dynamic_partition("documents", "b")
    assert reader.get_dynamic_partitions("documents") == ["a", "c", "d"]
    writer.delete_dynamic_partition("documents", "d")  # the newest: the largest id goes down
    writer.add_dynamic_partitions("documents", ["e"])
    assert reader.get_dynamic_partitions("documents") == ["a", "c", "e"]
    writer.delete_dynamic_partition("documents", "a")
    writer.add_dynamic_partitions("documents", ["f"])  # count unchanged, largest id up
    assert reader.get_dynamic_partitions("documents") == ["c", "e", "f"]
    # What the reader hands out is its caller's to change.
    keys = reader.get_dynamic_partitions("documents")
    keys.append("mutated")  # type: ignore[attr-defined]
    assert reader.get_dynamic_partitions("documents") == ["c", "e", "f"]
    assert reader.get_dynamic_partitions("other") == ["x"]
    reader.dispose()
    writer.dispose()
