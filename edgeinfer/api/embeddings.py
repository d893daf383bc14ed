"""The OpenAI embeddings dialect: POST /v1/embeddings."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from edgeinfer.api import fields
from edgeinfer.api.body import read_json
from edgeinfer.api.fields import Body
from edgeinfer.api.respond import CLIENT_GONE, json_response, leases, pool, unless_disconnected
from edgeinfer.errors import InvalidRequest
from edgeinfer.service.embedding import embed, shortened
from edgeinfer.service.request import EmbedRequest

MAX_EMBED_INPUTS = 2048  # inputs a request (OpenAI's limit; LangChain sends 512 at a time)


def parse(body: Any) -> tuple[EmbedRequest, bool, int | None]:
    """(request, base64 output, dimensions) from an embeddings body."""
    b = Body(body, {"model", "input", "encoding_format", "dimensions", "user"})
    model = b.string("model", required=True)
    assert model is not None
    items = fields.texts_or_tokens(b.body.get("input"), "input", MAX_EMBED_INPUTS)
    fmt = b.string("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise InvalidRequest("'encoding_format' must be 'float' or 'base64'",
                             param="encoding_format")
    return EmbedRequest(model, items), fmt == "base64", b.integer("dimensions", 1, 1 << 20, None)


async def embeddings(request: Request) -> Response:
    req, as_base64, dimensions = parse(await read_json(request))
    result = await unless_disconnected(request, embed(pool(request), req, leases(request)))
    if result is None:  # the client left: its work was stopped
        return Response(status_code=CLIENT_GONE)
    vectors = result.vectors
    if dimensions is not None and vectors:
        if dimensions > len(vectors[0]):
            raise InvalidRequest(f"'dimensions' must be at most this model's size, "
                                 f"{len(vectors[0])}", param="dimensions")
        vectors = shortened(vectors, dimensions)
    data = []
    for i, v in enumerate(vectors):
        emb: object = v
        if as_base64:
            emb = base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode("ascii")
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return await json_response({"object": "list", "data": data, "model": result.model,
                                "usage": {"prompt_tokens": result.tokens,
                                          "total_tokens": result.tokens}})
