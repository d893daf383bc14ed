"""The disk tier's files: written whole, checked on read, refused and removed when they
are foreign, corrupt or truncated, kept under the byte budget."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from edgeinfer.engine.host_memory import MAPPED_MIN, host_buffer
from edgeinfer.models.prefix_store import PrefixStore, model_identity

TOKENS = list(range(100, 400))
DATA = os.urandom(5000)


def store(tmp_path: Path, identity: str = "a" * 64, budget: int = 1 << 20) -> PrefixStore:
    return PrefixStore(tmp_path / "prefixes", identity, budget)


def test_what_is_saved_loads_back(tmp_path: Path) -> None:
    s = store(tmp_path)
    assert s.load(TOKENS) is None
    assert s.save(TOKENS, DATA) and s.load(TOKENS) == DATA
    assert s.load(TOKENS[:-1]) is None  # other tokens, another file
    assert not list(s.folder.glob(".*.tmp"))  # no temporary file left


def test_a_state_in_a_mapped_host_buffer_is_saved_as_its_bytes(tmp_path: Path) -> None:
    data = host_buffer(MAPPED_MIN + 7)  # as seq_state fills a large state
    data[:5000] = DATA
    s = store(tmp_path, budget=4 << 20)
    assert s.save(TOKENS, data, hot=True) and s.load(TOKENS) == bytes(data)
    assert s.load_hot() == [(TOKENS, bytes(data))]


@pytest.mark.parametrize("damage", ["truncate", "flip", "foreign", "garbage", "tokens"])
def test_a_damaged_or_foreign_file_is_refused_and_removed(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    s = store(tmp_path)
    s.save(TOKENS, DATA)
    path = s.path_for(TOKENS)
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[:-100])
    elif damage == "flip":
        path.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]))
    elif damage == "garbage":
        path.write_bytes(b"\x00" * 64)
    elif damage == "foreign":  # saved by another model file (or other parameters)
        other = store(tmp_path, identity="b" * 64)
        other.save(TOKENS, DATA)
        other.path_for(TOKENS).rename(path)
    else:  # another prefix's file under this one's name
        s.save(TOKENS[:10], DATA)
        s.path_for(TOKENS[:10]).rename(path)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.cache.disk"):
        assert s.load(TOKENS) is None
    assert "ignored and removed" in caplog.text and not path.exists()
    assert s.stats.rejected == 1


def test_the_budget_removes_the_least_recently_used(tmp_path: Path) -> None:
    s = store(tmp_path, budget=12000)
    prefixes = [TOKENS[:n] for n in (10, 20, 30)]
    for p in prefixes[:2]:
        assert s.save(p, DATA)
    os.utime(s.path_for(prefixes[0]), (1, 1))  # the oldest
    assert s.save(prefixes[2], DATA)
    assert s.load(prefixes[0]) is None and s.load(prefixes[1]) == DATA
    assert s.snapshot()["bytes"] <= 12000
    assert not s.save(TOKENS, os.urandom(13000))  # larger than the whole budget


def test_a_write_that_fails_is_logged_and_leaves_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "prefixes").write_text("a file where the folder should be")
    s = store(tmp_path)
    with caplog.at_level(logging.WARNING, logger="edgeinfer.cache.disk"):
        assert not s.save(TOKENS, DATA)
    assert "not saved" in caplog.text and s.stats.write_errors == 1


def test_the_identity_follows_the_file_and_the_parameters(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights")
    a = model_identity(f, {"context": 2048})
    assert a == model_identity(f, {"context": 2048}) != model_identity(f, {"context": 4096})
    f.write_bytes(b"other weights")
    assert model_identity(f, {"context": 2048}) != a


def test_hot_prefixes_load_back_with_their_tokens(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    s = store(tmp_path)
    s.save(TOKENS, DATA)  # a pinned prefix: not among the hot ones
    assert s.save(TOKENS[:50], b"hot1", hot=True) and s.save(TOKENS[:60], b"hot2", hot=True)
    assert sorted(s.load_hot()) == [(TOKENS[:50], b"hot1"), (TOKENS[:60], b"hot2")]
    s.drop_hot([TOKENS[:60]])  # the next save keeps only the new hot set
    assert s.load_hot() == [(TOKENS[:60], b"hot2")] and s.load(TOKENS) == DATA
    other = store(tmp_path, identity="b" * 64)  # other context parameters: not its own
    with caplog.at_level(logging.WARNING, logger="edgeinfer.cache.disk"):
        assert other.load_hot() == []
    assert not caplog.text and s.path_for(TOKENS[:60]).exists()  # left to its owner


def test_a_file_of_the_older_format_is_named_so(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    s = store(tmp_path)
    s.save(TOKENS, DATA)
    path = s.path_for(TOKENS)
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"EDGEINFER-KV\x02", b"EDGEINFER-KV\x01", 1))
    with caplog.at_level(logging.WARNING, logger="edgeinfer.cache.disk"):
        assert s.load(TOKENS) is None
    assert "an older format" in caplog.text and not path.exists()


def test_a_folder_it_cannot_write_still_serves_what_it_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A read-only store (a root-owned file, a read-only mount): loads work, unusable
    files are ignored without being removed, and nothing raises."""
    s = store(tmp_path)
    s.save(TOKENS, DATA)
    s.save(TOKENS[:50], DATA)
    bad = s.path_for(TOKENS[:50])
    bad.write_bytes(bad.read_bytes()[:-10])

    def refuse(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "utime", refuse)
    monkeypatch.setattr(Path, "unlink", refuse)
    assert s.load(TOKENS) == DATA
    with caplog.at_level(logging.WARNING, logger="edgeinfer.cache.disk"):
        assert s.load(TOKENS[:50]) is None
        assert s.load_hot() == []
    assert "cannot be removed" in caplog.text and bad.exists()


def test_another_configurations_hot_files_are_left_to_it(tmp_path: Path) -> None:
    """Two configurations sharing one folder (another context size): each keeps its own
    hot prefixes; the byte budget ages the other's out, not a restart."""
    mine, theirs = store(tmp_path), store(tmp_path, identity="b" * 64)
    assert theirs.save(TOKENS, DATA, hot=True)
    assert mine.load_hot() == [] and theirs.path_for(TOKENS).exists()
    assert [t for t, _ in theirs.load_hot()] == [TOKENS]


def test_run_time_pins_of_another_model_file_are_not_pinned_silently(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A run-time pin saved for the model's old file (re-downloaded since) is not pinned
    again, and a warning says so; another configuration's hot prefixes say nothing."""
    old, new = store(tmp_path, identity="b" * 64), store(tmp_path)
    assert old.save(TOKENS, DATA, runtime=True) and old.save(TOKENS[:50], DATA, hot=True)
    with caplog.at_level(logging.WARNING, "edgeinfer.cache.disk"):
        assert new.load_hot() == [] and not caplog.text
        assert new.load_hot("runtime") == []
    assert "1 prefixes pinned at run time were saved for another model file" in caplog.text
    assert [t for t, _ in old.load_hot("runtime")] == [TOKENS]
    caplog.clear()
    with caplog.at_level(logging.WARNING, "edgeinfer.cache.disk"):
        assert new.load_hot("runtime") == [] and not caplog.text  # said once
    new.drop_hot([], "runtime")  # DELETE /v1/cache/pins: the model's, of any file
    assert old.load_hot("runtime") == [] and old.path_for(TOKENS[:50]).exists()


def test_partial_writes_of_a_dead_writer_are_removed_by_age(tmp_path: Path) -> None:
    """A partial write untouched for an hour was left by a writer that died; a fresh one
    may be another container's live writer, whose process id means nothing here (a dead
    pid in this namespace once removed a live writer's file in another)."""
    s = store(tmp_path)
    s.save(TOKENS, DATA)
    dead = s.folder / f".{s.path_for(TOKENS).name}.host-999999999-abcd1234.tmp"
    live = s.folder / f".{s.path_for(TOKENS).name}.other-999999999-efef5678.tmp"
    for p in (dead, live):
        p.write_bytes(b"partial")
    os.utime(dead, (time.time() - 7200, time.time() - 7200))
    store(tmp_path)
    assert not dead.exists() and live.exists()
    assert s.load(TOKENS) == DATA  # the finished state is untouched


def test_each_write_goes_through_a_name_of_its_own(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two writers of one state (servers sharing the folder) never write one file."""
    s = store(tmp_path)
    seen: list[str] = []
    real = os.replace

    def spy(src: str | Path, dst: str | Path) -> None:
        seen.append(Path(src).name)
        real(src, dst)
    monkeypatch.setattr(os, "replace", spy)
    assert s.save(TOKENS, DATA) and s.save(TOKENS, DATA)
    assert len(set(seen)) == 2 and all(str(os.getpid()) in n for n in seen)
    assert s.load(TOKENS) == DATA and not list(s.folder.glob(".*.tmp"))


def test_a_named_pipe_in_the_folder_is_passed_over_not_waited_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A FIFO (or device) under a state's name once blocked start-up for good: opening it
    waited for a writer, and no signal ended the wait."""
    s = store(tmp_path)
    s.save(TOKENS, DATA, hot=True)
    os.mkfifo(s.folder / ("0" * 40 + ".kv"))
    os.mkfifo(s.path_for(TOKENS[:5]))
    (s.folder / ("1" * 40 + ".kv")).mkdir()
    s.path_for(TOKENS[:6]).mkdir()
    fds = len(os.listdir("/proc/self/fd"))
    with caplog.at_level(logging.WARNING, logger="edgeinfer.cache.disk"):
        assert s.load_hot() == [(TOKENS, DATA)]
        for _ in range(20):  # (each read of a folder left its descriptor open)
            assert s.load(TOKENS[:5]) is None and not s.flagged(TOKENS[:5], "hot")
            assert s.load(TOKENS[:6]) is None and not s.flagged(TOKENS[:6], "hot")
    assert "not a regular file" in caplog.text
    assert s.snapshot()["files"] == 1 and len(os.listdir("/proc/self/fd")) == fds


def test_a_cache_folder_that_cannot_be_made_costs_only_the_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EDGEINFER_CACHE naming a file (or a folder it cannot create): the model still loads;
    the disk tier's writes fail, logged, and its reads find nothing."""
    from edgeinfer.models.prefix_store import folder_of
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("EDGEINFER_CACHE", str(tmp_path / "a-file"))
    s = PrefixStore(folder_of("m"), "a" * 64, 1 << 20)
    assert not s.save(TOKENS, DATA) and s.stats.write_errors == 1
    assert s.load(TOKENS) is None and s.load_hot() == []
