"""POST /apply-template (as llama-server): the prompt a chat request renders to, for
users who debug a chat template or a tool format. Nothing is generated."""

from __future__ import annotations

import functools

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edgeinfer.api import openai_chat
from edgeinfer.api.body import read_json
from edgeinfer.api.respond import leases, pool
from edgeinfer.prompt.markup import segments
from edgeinfer.service.request import ChatPrompt
from edgeinfer.service.selection import model_named


async def apply_template(request: Request) -> Response:
    """A chat completions body in; ``{"prompt": text, "tool_format": name}`` out (the
    text exactly as the model sees it, request text included as plain text)."""
    req, _, _ = openai_chat.parse(await read_json(request), dict(request.headers))
    served = await model_named(pool(request), None if req.model in ("auto", "") else req.model,
                               leases(request))
    assert isinstance(req.prompt, ChatPrompt)
    tools = req.constraint.tools if req.constraint.offers_tools else ()
    text = await served.run(functools.partial(
        served.chat_text, [dict(m) for m in req.prompt.messages], tools,
        template_kwargs=req.template_kwargs))
    plain = "".join(part for part, _ in segments(text))
    return JSONResponse({"prompt": plain, "model": served.cfg.id,
                         "tool_format": served.tool_format.name})
