"""edgeinfer: a local LLM server on llama.cpp with slot-based continuous batching."""

from __future__ import annotations

__version__ = "0.1.0"
