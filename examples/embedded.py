"""Use edgeinfer inside your own Python app: no separate server process.

Run: .venv/bin/python examples/embedded.py
"""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.routing import Mount

from edgeinfer.inprocess import EdgeInfer


async def main() -> None:
    async with EdgeInfer.from_config(slots=4, context=2048) as ei:
        # 1. Call the engine directly: an async generator of text pieces.
        questions = ["Name a color.", "Name a fruit.", "Name an animal."]

        async def ask(q: str) -> str:
            parts = [p async for p in ei.chat("default", [{"role": "user", "content": q}],
                                               max_tokens=16, temperature=0)]
            return "".join(parts)

        answers = await asyncio.gather(*(ask(q) for q in questions))  # batched together
        for q, a in zip(questions, answers, strict=True):
            print(f"{q} -> {a!r}")

        # 2. Mount the same OpenAI-style API inside your own Starlette/FastAPI app.
        parent = Starlette(routes=[Mount("/llm", app=ei.asgi_app())])
        transport = httpx.ASGITransport(app=parent)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            r = await http.post("/llm/v1/chat/completions", json={
                "model": "default", "max_tokens": 16,
                "messages": [{"role": "user", "content": "Say hello."}]})
            r.raise_for_status()
            print("mounted API ->", repr(r.json()["choices"][0]["message"]["content"]))


if __name__ == "__main__":
    asyncio.run(main())
