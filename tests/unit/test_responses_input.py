"""The Responses API's ``input`` items as clients send them back."""

from __future__ import annotations

import pytest

from edgeinfer.api.responses_input import input_items
from edgeinfer.errors import InvalidRequest


def test_an_assistant_refusal_in_the_history_is_taken_as_its_text() -> None:
    """A conversation kept by the Agents SDK (or moved from OpenAI) holds an earlier
    answer's ``refusal`` part; OpenAI takes it back as input, so does this server."""
    items = input_items([
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "refusal", "refusal": "I can't help with that."}]},
        {"role": "user", "content": "again"}])
    assert items[1]["content"][0]["text"] == "I can't help with that."


@pytest.mark.parametrize("part", [
    {"type": "refusal"}, {"type": "refusal", "refusal": 5},
    {"type": "refusal", "refusal": "no", "extra": 1}, {"type": "input_image", "image_url": "u"},
])
def test_other_parts_are_a_400_naming_the_part(part: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest) as info:
        input_items([{"role": "assistant", "content": [part]}])
    assert info.value.param == "input[0].content[0]"
