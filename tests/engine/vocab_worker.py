"""The start of a child-process worker script that needs the default model's vocabulary
(no weights): ``vocab`` is defined, with ``json``, ``sys``, ``ctypes`` and ``llama_cpp``
imported. Tests that may make llama.cpp abort run their checks in such a child."""

VOCAB = r"""
import json, sys, ctypes
import llama_cpp
from edgeinfer.config import load_config
from edgeinfer.models.source import resolve_model_path

cfg = load_config(None).models[0]
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params()
mp.vocab_only = True
model = llama_cpp.llama_model_load_from_file(str(resolve_model_path(cfg)).encode(), mp)
vocab = llama_cpp.llama_model_get_vocab(model)
"""
