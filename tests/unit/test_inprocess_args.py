"""``EdgeInfer.chat`` / ``complete``'s keyword arguments as Python code writes them."""

from __future__ import annotations

import pytest

from edgeinfer.errors import InvalidRequest
from edgeinfer.inprocess import sampling_params


def test_python_shapes_are_taken() -> None:
    """Tuples where JSON has lists, int token ids, and logit_bias in SamplingParams' own
    shape (pairs) all give the same parameters as the HTTP body would."""
    p = sampling_params({"stop": ("a", "b"), "logit_bias": ((13, -100.0),), "seed": 1,
                         "dry_sequence_breakers": ("\n",), "max_tokens": 3})
    assert p.stop == ("a", "b") and p.logit_bias == ((13, -100.0),)
    assert p.dry_sequence_breakers == ("\n",) and (p.seed, p.max_tokens) == (1, 3)
    assert sampling_params({"logit_bias": {13: -100}}).logit_bias == ((13, -100.0),)


@pytest.mark.parametrize("kwargs", [{"temperature": 2.5}, {"logprobs": 2}, {"stop": 5}])
def test_out_of_bounds_or_unknown_is_a_named_400(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest) as info:
        sampling_params(kwargs)
    assert info.value.param == next(iter(kwargs))
