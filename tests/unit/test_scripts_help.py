"""Every script under scripts/ answers ``--help`` with its usage and starts nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))


def test_every_script_prints_its_usage_and_exits() -> None:
    assert len(SCRIPTS) >= 10
    runs = {p.name: subprocess.Popen([sys.executable, str(p), "--help"], text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for p in SCRIPTS}
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (name, err[-2000:])
        assert out.startswith("usage:"), (name, out[:200])
