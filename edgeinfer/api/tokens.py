"""llama-server's token endpoints: POST /tokenize and POST /detokenize.

The work (tokenizing, detokenizing, the pieces and the JSON) runs off the event
loop, holding the model, and both bodies are bounded in size.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgeinfer.api.body import read_json
from edgeinfer.api.fields import Body
from edgeinfer.api.respond import leases, pool
from edgeinfer.errors import InvalidRequest
from edgeinfer.service.selection import model_named

MAX_TOKENIZE_CHARS = 1 << 20  # /tokenize: characters of one text
MAX_PIECES = 65_536  # tokens /tokenize lists with their pieces
MAX_DETOKENIZE = 1 << 18  # /detokenize: token ids of one request


def parse_tokenize(body: Any) -> tuple[str | None, str, bool, bool, bool]:
    """POST /tokenize: (model, content, add_special, parse_special, with_pieces)."""
    b = Body(body, {"model", "content", "add_special", "parse_special", "with_pieces"})
    content = b.string("content", required=True)
    assert content is not None
    if len(content) > MAX_TOKENIZE_CHARS:
        raise InvalidRequest(f"'content' may be at most {MAX_TOKENIZE_CHARS} characters "
                             f"(got {len(content)})", param="content")
    return (b.string("model"), content, b.boolean("add_special", False),
            b.boolean("parse_special", True), b.boolean("with_pieces", False))


def parse_detokenize(body: Any) -> tuple[str | None, list[int]]:
    """POST /detokenize: (model, token ids); the ids are checked against the vocabulary
    by ``detokenize``."""
    b = Body(body, {"model", "tokens"})
    tokens = b.body.get("tokens")
    if isinstance(tokens, list) and len(tokens) > MAX_DETOKENIZE:
        raise InvalidRequest(f"'tokens' may hold at most {MAX_DETOKENIZE} ids", param="tokens")
    if not isinstance(tokens, list):
        raise InvalidRequest("'tokens' must be a list of token ids", param="tokens")
    return b.string("model"), tokens


def _json_bytes(value: Any) -> bytes:
    return bytes(JSONResponse(value).body)


async def tokenize(request: Request) -> Response:
    """Count tokens before sending a prompt (llama-server's /tokenize shape)."""
    name, content, add_special, parse_special, with_pieces = parse_tokenize(
        await read_json(request))
    served = await model_named(pool(request), name, leases(request))
    rt = served.runtime

    def work() -> bytes:
        tokens = rt.tokenize(content, add_special=add_special, parse_special=parse_special)
        if not with_pieces:
            return _json_bytes({"tokens": tokens, "model": served.cfg.id})
        if len(tokens) > MAX_PIECES:
            raise InvalidRequest(f"'with_pieces' is allowed for at most {MAX_PIECES} tokens; "
                                 f"this text has {len(tokens)}", param="with_pieces")
        pieces = [{"id": t, "piece": _piece(rt.piece(t))} for t in tokens]
        return _json_bytes({"tokens": pieces, "model": served.cfg.id})

    return Response(await served.run(work), media_type="application/json")


def _piece(raw: bytes) -> str | list[int]:
    """A token's text, or its bytes when they are not whole UTF-8 (part of a character),
    as llama-server answers: a client joins the bytes of consecutive pieces."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def detokenize(request: Request) -> Response:
    name, tokens = parse_detokenize(await read_json(request))
    served = await model_named(pool(request), name, leases(request))
    rt = served.runtime

    def work() -> bytes:
        n_vocab = rt.info.n_vocab
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab
                   for t in tokens):
            raise InvalidRequest(f"'tokens' must be a list of token ids in 0..{n_vocab - 1}",
                                 param="tokens")
        return _json_bytes({"content": rt.detokenize(tokens), "model": served.cfg.id})

    return Response(await served.run(work), media_type="application/json")
