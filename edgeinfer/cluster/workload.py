"""The shared-prefix workload of the routing test and ``scripts/bench_ray.py``.

``prompts`` makes distinct system prompts of about ``tokens`` tokens; ``requests``
pairs them with short questions in a shuffled order; ``run`` sends them to a chat
completions URL, ``concurrency`` at a time, and adds up what the server reports: prompt
tokens, cached tokens (``usage.prompt_tokens_details.cached_tokens``) and so the tokens
it computed. With perfect prefix routing the computed tokens are the prefixes once
each plus every request's suffix.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

_WORDS = ("harbor", "lantern", "granite", "meadow", "copper", "violet", "orchard", "signal",
          "glacier", "timber", "saffron", "beacon", "canyon", "marble", "thistle", "ember",
          "falcon", "juniper", "quarry", "cobalt", "willow", "summit", "delta", "prairie")


def prompts(count: int, tokens: int = 1000, seed: int = 0) -> list[str]:
    """``count`` system prompts of roughly ``tokens`` tokens, different from the start."""
    out = []
    for i in range(count):
        rnd = random.Random(f"{seed}:{i}")
        lines = [f"You are the archivist of station {i}. Answer from these records."]
        while sum(len(x) for x in lines) < tokens * 4.2:
            a, b, c = (rnd.choice(_WORDS) for _ in range(3))
            lines.append(f"Record {len(lines)}: the {a} {b} was moved to the {c} wing "
                         f"on day {rnd.randint(1, 999)}.")
        out.append("\n".join(lines))
    return out


Chat = tuple[int, list[dict[str, str]]]


def requests(systems: list[str], total: int, seed: int = 0) -> list[Chat]:
    """``total`` chats spread evenly over ``systems`` in a shuffled order: (prefix, messages)."""
    chats = [(i % len(systems), [{"role": "system", "content": systems[i % len(systems)]},
                                 {"role": "user", "content": f"Question {i}: what moved first?"}])
             for i in range(total)]
    random.Random(seed).shuffle(chats)
    return chats


@dataclass(frozen=True, slots=True)
class Figures:
    requests: int
    errors: int
    prompt_tokens: int
    cached_tokens: int
    seconds: float

    @property
    def computed(self) -> int:
        """Prompt tokens the servers computed (not taken from a prefix cache)."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _one(client: httpx.Client, url: str, model: str, messages: list[dict[str, str]],
         max_tokens: int) -> tuple[int, int]:
    r = client.post(url, json={"model": model, "messages": messages, "max_tokens": max_tokens,
                               "temperature": 0})
    r.raise_for_status()
    usage = r.json()["usage"]
    return usage["prompt_tokens"], (usage.get("prompt_tokens_details") or {}).get(
        "cached_tokens", 0)


def run(base_url: str, chats: list[Chat], concurrency: int = 4,
        model: str = "default", max_tokens: int = 4, timeout: float = 600.0) -> Figures:
    """Send ``chats`` to ``base_url``/v1/chat/completions and add up the usage."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    start = time.monotonic()
    results: list[tuple[int, int] | None] = []
    with httpx.Client(timeout=timeout) as client, ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(_one, client, url, model, m, max_tokens) for _, m in chats]
        for f in futures:
            try:
                results.append(f.result())
            except httpx.HTTPError:
                results.append(None)
    done = [r for r in results if r is not None]
    return Figures(len(chats), len(results) - len(done), sum(p for p, _ in done),
                   sum(c for _, c in done), time.monotonic() - start)
