"""llama-server's fill-in-the-middle endpoint, POST /infill, as llama.vim and llama.vscode
call it: ``input_prefix`` and ``input_suffix`` (the code around the cursor), optional
``input_extra`` (``[{"filename", "text"}]``: other files, as context) and ``prompt`` (the
start of the line, after the prefix); everything else as /completion takes it, and the
answer in its shape. A model without FIM tokens answers 501, as llama-server does.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from edgeinfer.api import llama_native
from edgeinfer.api.body import read_json_any
from edgeinfer.api.respond import leases, pool
from edgeinfer.errors import InvalidRequest, NotSupported
from edgeinfer.models.infill import InfillInput, fim_tokens, infill_prompt
from edgeinfer.service.selection import model_named

MAX_EXTRA = 256  # files of input_extra


def parse(body: Any) -> tuple[InfillInput, dict[str, Any]]:
    """(the infill's parts, the rest of the body: a /completion body without a prompt)."""
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object")
    rest = {k: v for k, v in body.items() if k not in (
        "input_prefix", "input_suffix", "input_extra", "prompt")}
    texts = {}
    for name in ("input_prefix", "input_suffix", "prompt"):
        value = body.get(name, "" if name == "prompt" else None)
        if not isinstance(value, str):
            raise InvalidRequest(f"'{name}' must be a string" if name in body
                                 else f"'{name}' is required", param=name)
        texts[name] = value
    extra = body.get("input_extra", [])
    if not isinstance(extra, list) or len(extra) > MAX_EXTRA:
        raise InvalidRequest(f"'input_extra' must be an array of at most {MAX_EXTRA} "
                             '{"filename": string, "text": string}', param="input_extra")
    chunks = []
    for i, chunk in enumerate(extra):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise InvalidRequest(f"'input_extra[{i}]' must have a 'text' string",
                                 param=f"input_extra[{i}].text")
        name = chunk.get("filename", "tmp")
        if not isinstance(name, str):
            raise InvalidRequest(f"'input_extra[{i}].filename' must be a string",
                                 param=f"input_extra[{i}].filename")
        chunks.append((name, chunk["text"]))
    return InfillInput(texts["input_prefix"], texts["input_suffix"], tuple(chunks),
                       texts["prompt"]), rest


async def infill(request: Request) -> Response:
    """The completion of the middle, in /completion's shape (streamed too)."""
    given, rest = parse(await read_json_any(request))
    model = rest.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("'model' must be a string", param="model")
    served = await model_named(pool(request), model, leases(request))
    fim = fim_tokens(served.runtime)
    if fim is None:
        raise NotSupported(f"infill is not supported by model '{served.cfg.id}': it has no "
                           "fill-in-the-middle tokens")
    limit = rest.get("n_predict", rest.get("max_tokens"))
    tokens = await served.run(lambda: infill_prompt(
        served.runtime, fim, given, limit if type(limit) is int and limit > 0 else None,
        served.bos_head()))
    return await llama_native.answer(request, {**rest, "model": served.cfg.id,
                                               "prompt": tokens})
