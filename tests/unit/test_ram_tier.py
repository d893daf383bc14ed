"""The RAM tier's bookkeeping: the longest kept prefix, the byte budget, LRU order."""

from __future__ import annotations

from edgeinfer.engine.ram_tier import RamTier


def test_the_longest_kept_prefix_is_found_and_taken_once() -> None:
    ram = RamTier(budget=1000)
    assert ram.put([1, 2, 3], b"a" * 100) and ram.put([1, 2, 3, 4, 5], b"b" * 100)
    n, hid = ram.match([1, 2, 3, 4, 5, 6])
    assert n == 5 and hid is not None
    assert ram.take(hid) == ([1, 2, 3, 4, 5], b"b" * 100)
    assert ram.match([1, 2, 3, 4, 5, 6])[0] == 3 and ram.bytes == 100
    assert ram.match([9])[1] is None


def test_the_budget_drops_the_oldest_and_refuses_what_cannot_fit() -> None:
    ram = RamTier(budget=250)
    for i in range(3):
        ram.put([i, i], bytes(100))
    assert ram.bytes <= 250 and ram.match([0, 0])[1] is None  # the oldest went
    assert ram.match([2, 2])[0] == 2 and ram.stats.dropped == 1
    assert not ram.put([7], bytes(300))
    assert not RamTier(0).enabled


def test_a_state_given_back_is_kept_again() -> None:
    ram = RamTier(budget=1000)
    ram.put([1, 2], b"x" * 10)
    _, hid = ram.match([1, 2])
    assert hid is not None
    tokens, data = ram.take(hid)
    ram.give_back(tokens, data)
    assert ram.match([1, 2])[0] == 2 and ram.stats.restored == 0 and ram.stats.saved == 1


def test_checkpoints_are_reused_whole_and_stay_kept() -> None:
    ram = RamTier(budget=1000)
    ram.put([1, 2, 3], b"a" * 10)
    ram.put([1, 2, 3, 4, 5], b"b" * 10)
    ram.put([1, 2, 9, 9], b"c" * 10)
    # the longest state all of whose tokens begin the prompt, within the limit
    assert ram.whole_prefix([1, 2, 3, 4, 5, 6], limit=6)[0] == 5
    assert ram.whole_prefix([1, 2, 3, 4, 5, 6], limit=4)[0] == 3  # 5 tokens > limit
    assert ram.whole_prefix([1, 2, 3, 4, 7], limit=5)[0] == 3  # [1..5] is not whole in it
    assert ram.whole_prefix([1, 2, 9], limit=3) == (0, None)  # [1,2,9,9] is longer
    n, hid = ram.whole_prefix([1, 2, 3, 4, 5, 6], limit=6)
    assert hid is not None and ram.get(hid) == b"b" * 10
    assert ram.snapshot()["entries"] == 3  # get leaves it kept
    assert ram.state([1, 2, 3]) == b"a" * 10 and ram.state([1, 2]) is None


def test_pinned_states_are_never_pushed_out() -> None:
    ram = RamTier(budget=300)
    assert ram.put([1], bytes(100), pinned=True)
    for i in range(5):
        assert ram.put([10 + i], bytes(100))
    assert ram.has([1]) and ram.bytes <= 300
    assert not ram.put([2], bytes(250))  # does not fit beside the pinned one
    assert ram.unpin_all() == 1
    ram.put([3], bytes(250))
    assert not ram.has([1])
