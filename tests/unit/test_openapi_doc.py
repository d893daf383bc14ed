"""/openapi.json as OpenAPI validators read it: every path parameter is declared."""

from __future__ import annotations

import re

from edgeinfer.api.openapi import openapi_spec


def test_every_path_parameter_is_declared_by_each_operation() -> None:
    """A template's ``{name}`` needs an ``in: path`` parameter in each of its operations
    (or the path's own list): validators, and client generators that validate first,
    refuse the whole document otherwise (``/api/blobs/{digest}`` had none)."""
    missing = []
    for path, item in openapi_spec()["paths"].items():
        names = set(re.findall(r"{([^}:]+)}", path))
        shared = {p["name"] for p in item.get("parameters", ()) if p["in"] == "path"}
        for method, op in item.items():
            if method == "parameters":
                continue
            declared = shared | {p["name"] for p in op.get("parameters", ())
                                 if p["in"] == "path"}
            if names != declared:
                missing.append(f"{method.upper()} {path}: {sorted(names ^ declared)}")
    assert missing == []
