"""The disk tier of the prefix cache: pinned prefixes' KV state kept across restarts.

When a model pins a prefix (a models.toml ``pinned_prompts`` entry, or ``POST
/v1/cache/pin``), its computed KV state is written here; when the model loads again
(a restart, a reload after its ttl) the state is read back instead of computing the
prompt, so the first request after a restart is warm. Prefixes pinned at run time are
pinned again at load from their files (``DELETE /v1/cache/pins`` removes those files).
Opt-in (models.toml ``cache_disk_hot``), the most used unpinned prefixes are written here
too when the model unloads or the server stops, and all of them are restored when it loads.

One file per prefix, named by a hash of the model's identity (its file's path, size
and modification time, the llama.cpp build and the context parameters that shape the
state) and the prefix's tokens. A file is written to a temporary name, flushed and
renamed, so a crash leaves no half file under a real name. A file is checked on read:
its magic, header, the model identity and tokens it was saved for, its length and a
SHA-256 of its tokens and data; anything else (truncated, corrupt, foreign, stale) is logged,
removed and never given to llama.cpp. The folder is kept under a byte budget, least
recently used files removed first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeinfer.engine.host_memory import State
from edgeinfer.models.partial import partial_name, remove_stale
from edgeinfer.models.source import cache_dir

log = logging.getLogger("edgeinfer.cache.disk")

MAGIC = b"EDGEINFER-KV\x02\n"  # 2: the tokens are in the file (hot prefixes)
SUFFIX = ".kv"
_HEADER_MAX = 4096


def read_file(path: Path, limit: int = -1) -> bytes:
    """The bytes of the regular file at ``path`` (at most ``limit``); OSError for anything
    else: a named pipe or device put in the folder must not block the reader for good."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path.name} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def model_identity(path: Path, params: dict[str, Any]) -> str:
    """A model file and the parameters of its context, as one hex string (a state saved
    under one identity is never loaded under another)."""
    st = path.stat()
    facts = {"file": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
             **params}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def _tokens_digest(tokens: list[int]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()


@dataclass(slots=True)
class StoreStats:
    saves: int = 0
    restores: int = 0
    rejected: int = 0  # files found unusable and removed
    write_errors: int = 0


_FOREIGN = "saved for another model file or other context parameters"
_WARNED: set[Path] = set()  # folders whose foreign run-time pins were reported


class PrefixStore:
    """Saved prefix states of one model (thread-safe; blocking: call off the event loop)."""

    def __init__(self, folder: Path, identity: str, budget_bytes: int) -> None:
        self.folder = folder
        self.identity = identity
        self.budget = budget_bytes
        self.stats = StoreStats()
        self._lock = threading.Lock()
        remove_stale(folder, f".*{SUFFIX}.*.tmp")  # writes of processes that died

    def path_for(self, tokens: list[int]) -> Path:
        key = hashlib.sha256(f"{self.identity}:{_tokens_digest(tokens)}".encode()).hexdigest()
        return self.folder / f"{key[:40]}{SUFFIX}"

    # -- reading ------------------------------------------------------------------
    def load(self, tokens: list[int]) -> bytes | None:
        """The saved state of ``tokens`` (None: none, or the file was unusable)."""
        path = self.path_for(tokens)
        with self._lock:
            try:
                raw = read_file(path)
            except FileNotFoundError:
                return None
            except OSError as exc:
                log.warning("prefix cache file %s cannot be read (%s): ignored", path.name, exc)
                return None
            body, why = self._check(raw, tokens)
            if body is None:
                self.reject(path, why)
                return None
            with contextlib.suppress(OSError):  # a read-only folder still serves
                os.utime(path)  # recently used
            self.stats.restores += 1
            return body[4 * len(tokens):]

    def _check(self, raw: bytes, tokens: list[int] | None) -> tuple[bytes | None, str]:
        """The state in ``raw`` if it is whole and was saved for this identity and
        ``tokens`` (None: any tokens), else (None, why)."""
        head, why = self._header(raw)
        if head is None:
            return None, why
        if tokens is not None and head.get("tokens") != _tokens_digest(tokens):
            return None, "saved for other tokens"
        body = raw[head["_start"]:]
        n_tokens, size = head.get("n_tokens"), head.get("size")
        if not isinstance(n_tokens, int) or not isinstance(size, int):
            return None, "corrupt header"
        if len(body) != 4 * n_tokens + size:
            return None, f"truncated ({len(body)} of {4 * n_tokens + size} bytes)"
        if hashlib.sha256(body).hexdigest() != head.get("sha256"):
            return None, "corrupt data (checksum mismatch)"
        return body, ""

    def _header(self, raw: bytes, any_identity: bool = False
                ) -> tuple[dict[str, Any] | None, str]:
        if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + 4:
            older = raw.startswith(MAGIC[:-2])
            return None, "an older format" if older else "not a prefix cache file"
        (n,) = struct.unpack_from("<I", raw, len(MAGIC))
        start = len(MAGIC) + 4
        if n > _HEADER_MAX or len(raw) < start + n:
            return None, "truncated header"
        try:
            head = json.loads(raw[start:start + n])
        except ValueError:
            return None, "corrupt header"
        if not isinstance(head, dict) or (self.identity and not any_identity
                                          and head.get("model") != self.identity):
            return None, _FOREIGN
        head["_start"] = start + n
        return head, ""

    def _head_of(self, path: Path, any_identity: bool = False) -> dict[str, Any] | None:
        """The header of the file at ``path`` (its first bytes only), None when there is
        none this identity (``any_identity``: any) wrote; OSError when it cannot be read."""
        return self._header(read_file(path, _HEADER_MAX + len(MAGIC) + 4), any_identity)[0]

    def flagged(self, tokens: list[int], kind: str) -> bool:
        """Whether the file of ``tokens`` is saved as ``kind`` ("hot", "runtime")."""
        try:
            head = self._head_of(self.path_for(tokens))
        except OSError:
            return False
        return head is not None and bool(head.get(kind))

    def load_hot(self, kind: str = "hot") -> list[tuple[list[int], bytes]]:
        """Every saved hot prefix (``save(..., hot=True)``), or with ``kind`` "runtime"
        every prefix pinned at run time, as (tokens, state); unusable files are removed,
        saying why."""
        out, foreign = [], 0
        with self._lock:
            for _, _, path in self._files():
                try:
                    head = self._head_of(path)  # the header first: most are skipped
                    if head is not None and not head.get(kind):
                        continue  # (a models.toml pin: loaded by its tokens)
                    raw = read_file(path)
                except OSError:
                    continue
                body, why = self._check(raw, None)
                if body is None and why == _FOREIGN:
                    foreign += self._foreign_kind(raw, kind)
                    continue  # another configuration's (sharing the folder): aged by the budget
                if body is None:
                    self.reject(path, why)
                    continue
                n = int(head["n_tokens"]) if head else 0
                out.append((list(struct.unpack_from(f"<{n}i", body)), body[4 * n:]))
                self.stats.restores += 1
        if foreign and kind == "runtime" and self.folder not in _WARNED:
            _WARNED.add(self.folder)  # (once: they stay until DELETE /v1/cache/pins or aged out)
            log.warning("%d prefixes pinned at run time were saved for another model file or "
                        "other context parameters: not pinned again (POST /v1/cache/pin pins "
                        "them anew; DELETE /v1/cache/pins removes them)", foreign)
        return out

    def _foreign_kind(self, raw: bytes, kind: str) -> int:
        """1 when ``raw`` (a file of another identity) is saved as ``kind``, else 0."""
        head = self._header(raw, any_identity=True)[0]
        return int(head is not None and bool(head.get(kind)))

    def drop_hot(self, keep: list[list[int]], kind: str = "hot") -> None:
        """Remove the hot prefixes' files (with ``kind`` "runtime": those pinned at run
        time, saved for any model file or context parameters: unpinning all is for the
        model) other than those of ``keep``."""
        wanted = {self.path_for(t) for t in keep}
        with self._lock:
            for _, _, path in self._files():
                with contextlib.suppress(OSError):
                    head = self._head_of(path, any_identity=kind == "runtime")
                    if head is not None and head.get(kind) and path not in wanted:
                        path.unlink()

    def reject(self, path: Path, why: str) -> None:
        """Remove an unusable file, saying why."""
        self.stats.rejected += 1
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("prefix cache file %s ignored (%s); it cannot be removed: %s",
                        path.name, why, exc)
            return
        log.warning("prefix cache file %s ignored and removed: %s", path.name, why)

    # -- writing ------------------------------------------------------------------
    def save(self, tokens: list[int], data: State, hot: bool = False,
             runtime: bool = False) -> bool:
        """Write the state of ``tokens`` (atomically); False when it could not be written
        (no room under the budget, a full disk ...), which is logged. ``hot``: an
        unpinned prefix, restored by ``load_hot``; ``runtime``: pinned by ``POST
        /v1/cache/pin``, pinned again at load (``load_hot("runtime")``); a models.toml pin
        is loaded by its tokens."""
        if not data or len(data) > self.budget:
            if data:
                log.warning("prefix state of %d tokens (%d MiB) is over the disk budget "
                            "(cache_disk_mb): not saved", len(tokens), len(data) >> 20)
            return False
        packed = struct.pack(f"<{len(tokens)}i", *tokens)
        head = json.dumps({"model": self.identity, "tokens": _tokens_digest(tokens),
                           "n_tokens": len(tokens), "size": len(data), "hot": hot,
                           "runtime": runtime,
                           "sha256": hashlib.sha256(packed + data).hexdigest()}).encode()
        path = self.path_for(tokens)
        tmp = partial_name(path, "tmp")
        with self._lock:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
                self._make_room(len(data), keep=path)
                with open(tmp, "wb") as f:
                    f.write(MAGIC + struct.pack("<I", len(head)) + head)
                    f.write(packed)
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except OSError as exc:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
                self.stats.write_errors += 1
                log.warning("prefix state of %d tokens not saved to %s: %s", len(tokens),
                            self.folder, exc)
                return False
            self.stats.saves += 1
            return True

    def _make_room(self, size: int, keep: Path) -> None:
        """Remove least recently used files until ``size`` more bytes fit the budget."""
        files = [f for f in self._files() if f[2] != keep]
        used = sum(f[1] for f in files)
        for _, n, p in sorted(files):
            if used + size <= self.budget:
                break
            with contextlib.suppress(OSError):
                p.unlink(missing_ok=True)
                used -= n

    def _files(self) -> list[tuple[float, int, Path]]:
        """(modification time, size, path) of the saved states (a file removed while
        listing, by the budget or a reject, is left out)."""
        out = []
        for p in self.folder.glob(f"*{SUFFIX}") if self.folder.is_dir() else []:
            with contextlib.suppress(OSError):
                st = p.stat()
                if stat.S_ISREG(st.st_mode):  # (a folder, pipe or device: not one)
                    out.append((st.st_mtime, st.st_size, p))
        return out

    def snapshot(self) -> dict[str, int]:
        files = self._files()
        s = self.stats
        return {"files": len(files), "bytes": sum(f[1] for f in files),
                "budget_bytes": self.budget, "saves": s.saves, "restores": s.restores,
                "rejected": s.rejected, "write_errors": s.write_errors}


def folder_of(model_id: str) -> Path:
    """Where a model's prefix files are kept."""
    return cache_dir() / "prefixes" / model_id.replace("/", "_")


def drop_runtime_pins(model_id: str) -> None:
    """Remove the files of the prefixes pinned at run time of a model that is not loaded
    (``POST /v1/cache/pin``'s: its next load would pin them again)."""
    folder = folder_of(model_id)
    if folder.is_dir():
        PrefixStore(folder, "", 0).drop_hot([], "runtime")  # ("": files of any identity)
