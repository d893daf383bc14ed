"""``edgeinfer chat``: a terminal chat against a running server, streaming."""

from __future__ import annotations

import json
import sys

import httpx

from edgeinfer.cli.sse import delta_text, sse_json_sync


def chat_loop(url: str, model: str, system: str | None, api_key: str | None,
              max_tokens: int | None = None) -> int:
    """Read a line, stream the answer, repeat; an empty line or end of input quits.
    Ctrl-C during an answer stops it (what was shown stays in the conversation)."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    with httpx.Client(base_url=url, headers=headers, timeout=600) as client:
        try:
            client.get("/health").raise_for_status()
        except httpx.HTTPError as exc:
            sys.stderr.write(f"cannot reach {url}: {exc}\n")
            return 1
        while True:
            sys.stdout.write("you> ")
            sys.stdout.flush()
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:  # Ctrl-C at the prompt quits
                sys.stdout.write("\n")
                return 0
            if not line.strip():
                return 0
            messages.append({"role": "user", "content": line.strip()})
            reply = _stream(client, model, messages, max_tokens)
            if reply is None:
                messages.pop()
                continue
            messages.append({"role": "assistant", "content": reply})


def _stream(client: httpx.Client, model: str, messages: list[dict[str, str]],
            max_tokens: int | None = None) -> str | None:
    body: dict[str, object] = {"model": model, "messages": messages, "stream": True}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    parts: list[str] = []
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            sys.stderr.write(f"error: {json.loads(r.read()).get('error', {}).get('message')}\n")
            return None
        sys.stdout.write("assistant> ")
        try:
            for chunk in sse_json_sync(r):
                if "error" in chunk:
                    sys.stderr.write(f"\nerror: {chunk['error'].get('message')}\n")
                    return None
                text = delta_text(chunk)
                parts.append(text)
                sys.stdout.write(text)
                sys.stdout.flush()
        except KeyboardInterrupt:  # the answer stops here (closing the stream ends it)
            sys.stdout.write(" [stopped]")
    sys.stdout.write("\n")
    return "".join(parts)
