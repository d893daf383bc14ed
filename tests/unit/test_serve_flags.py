"""``edgeinfer serve``'s flags as argparse reads them: values models.toml takes are
taken here too, and a bad one is a one-line error at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeinfer.cli import flags
from edgeinfer.cli.main import build_parser
from edgeinfer.errors import ConfigError


def test_gpu_layers_takes_a_count_or_auto_as_models_toml_does() -> None:
    parse = build_parser().parse_args
    assert parse(["serve", "--gpu-layers", "auto"]).gpu_layers == "auto"  # was refused
    assert parse(["serve", "--gpu-layers", "12"]).gpu_layers == 12
    assert parse(["serve"]).gpu_layers is None  # models.toml's value stays
    with pytest.raises(SystemExit):
        parse(["serve", "--gpu-layers", "lots"])


@pytest.mark.parametrize("argv, named", [
    (["--send-timeout", "nan"], "--send-timeout"),
    (["--request-timeout", "0"], "--request-timeout"),
    (["--drain-delay", "-1"], "--drain-delay"),
])
def test_a_flag_out_of_range_is_named(argv: list[str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        flags.check_serve_flags(build_parser().parse_args(["serve", *argv]))


def test_a_ready_file_whose_folder_cannot_be_written_is_refused_at_start(tmp_path: Path) -> None:
    """(It was a traceback once the model had loaded: /sys refuses even root.)"""
    check = flags.check_serve_flags
    check(build_parser().parse_args(["serve", "--ready-file", str(tmp_path / "r.json")]))
    assert list(tmp_path.iterdir()) == []  # the trial write leaves nothing
    with pytest.raises(ConfigError, match="cannot be written"):
        check(build_parser().parse_args(["serve", "--ready-file", "/sys/ready.json"]))
    with pytest.raises(ConfigError, match="does not exist"):
        check(build_parser().parse_args(["serve", "--ready-file", str(tmp_path / "no/r")]))


def test_the_connection_timeout_flags_default_to_what_the_server_parts_assume() -> None:
    """The CLI keeps its own copy of the defaults (importing the HTTP parts would slow
    every command by starlette's import); an app run without the CLI (``EdgeInfer``,
    tests) gets the parts' own: they must be the same numbers."""
    from edgeinfer.api.body import BODY_TIMEOUT
    from edgeinfer.cli.deadline import HEADER_TIMEOUT
    args = build_parser().parse_args(["serve"])
    assert (args.header_timeout, args.body_timeout) == (HEADER_TIMEOUT, BODY_TIMEOUT)
