"""The radix index as a pure unit, checked against a brute-force model."""

from __future__ import annotations

import random

from edgeinfer.engine.prefix_index import PrefixIndex, common_prefix


def test_common_prefix() -> None:
    assert common_prefix([], [1]) == 0
    assert common_prefix(list(range(200)), list(range(150)) + [0]) == 150
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3


def test_match_finds_longest_prefix_and_a_holder() -> None:
    idx = PrefixIndex()
    idx.extend(0, [1, 2, 3, 4, 5])
    idx.extend(1, [1, 2, 3, 9])
    assert idx.match([1, 2, 3, 4, 5, 6]) == (5, 0)
    assert idx.match([1, 2, 3, 9, 9]) == (4, 1)
    n, h = idx.match([1, 2, 7])
    assert n == 2 and h in (0, 1)
    assert idx.match([8]) == (0, None)
    assert idx.num_tokens == 6  # 1 2 3 shared, then 4 5 and 9


def test_extend_grows_and_branches() -> None:
    idx = PrefixIndex()
    idx.extend(0, [1, 2])
    idx.extend(0, [3])
    assert idx.tokens_of(0) == [1, 2, 3] and idx.length(0) == 3
    idx.extend(1, [1, 2])  # ends inside 0's node: split
    idx.extend(1, [7])
    assert idx.tokens_of(1) == [1, 2, 7] and idx.tokens_of(0) == [1, 2, 3]
    assert idx.num_tokens == 4


def test_remove_keeps_shared_cells_and_drops_the_rest() -> None:
    idx = PrefixIndex()
    idx.extend(0, [1, 2, 3, 4])
    idx.extend(1, [1, 2, 5])
    idx.remove(0)
    assert idx.match([1, 2, 3]) == (2, 1)
    assert idx.num_tokens == 3
    idx.remove(1)
    assert idx.num_tokens == 0 and idx.match([1]) == (0, None)


def test_rename_and_exclude_and_truncate() -> None:
    idx = PrefixIndex()
    idx.extend(3, [1, 2, 3])
    idx.rename(3, 40)
    assert idx.match([1, 2, 3]) == (3, 40) and idx.holders() == [40]
    assert idx.match([1, 2, 3], exclude=40) == (0, None)
    idx.truncate(40, 1)
    assert idx.tokens_of(40) == [1] and idx.num_tokens == 1


def test_random_operations_agree_with_brute_force() -> None:
    rng = random.Random(7)
    idx = PrefixIndex()
    model: dict[int, list[int]] = {}
    for _ in range(3000):
        op = rng.random()
        h = rng.randrange(6)
        if op < 0.55:
            base = model.get(h, [])
            # extend from another holder's content to create sharing
            donor = model.get(rng.randrange(6), [])
            start = len(base)
            new = donor[start:start + rng.randrange(1, 6)] or [rng.randrange(4)]
            new += [rng.randrange(4) for _ in range(rng.randrange(3))]
            idx.extend(h, new)
            model[h] = base + new
        elif op < 0.75:
            idx.remove(h)
            model.pop(h, None)
        elif op < 0.85 and h in model:
            cut = rng.randrange(len(model[h]) + 1)
            idx.truncate(h, cut)
            model[h] = model[h][:cut]
            if not model[h]:
                idx.remove(h)
                del model[h]
        query = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        if model and rng.random() < 0.5:
            query = rng.choice(list(model.values()))[: rng.randrange(1, 12)] + query
        n, holder = idx.match(query)
        best = max((common_prefix(t, query) for t in model.values()), default=0)
        assert n == best
        if n:
            assert holder is not None and common_prefix(model[holder], query) >= n
        for k, toks in model.items():
            assert idx.tokens_of(k) == toks
        # distinct tokens = size of the union of all prefixes (a trie of the holders' lists)
        trie = {tuple(t[:i]) for t in model.values() for i in range(1, len(t) + 1)}
        assert idx.num_tokens == len(trie)


def test_checkpoint_positions_of_a_prompt() -> None:
    from edgeinfer.engine.prefix_cache import PrefixCache

    cache = PrefixCache(None, 4, 8, enabled=True, ram_bytes=1 << 20,  # type: ignore[arg-type]
                        checkpoint_every=64)
    assert cache.mode == "checkpoint" and cache.entries == {} and cache.enabled
    assert cache.checkpoints_for(200, 0) == (64, 128, 192, 199)
    assert cache.checkpoints_for(200, 128) == (192, 199)
    assert cache.checkpoints_for(129, 0) == (64, 128)  # the end's checkpoint is 128 too
    only_end = PrefixCache(None, 4, 8, enabled=True, ram_bytes=1 << 20,  # type: ignore[arg-type]
                           checkpoint_every=0)
    assert only_end.checkpoints_for(200, 0) == (199,)
    kv = PrefixCache(None, 4, 8, enabled=True, ram_bytes=1 << 20)  # type: ignore[arg-type]
    assert kv.mode == "kv" and kv.checkpoints_for(200, 0) == ()
    off = PrefixCache(None, 4, 8, enabled=True, ram_bytes=0,  # type: ignore[arg-type]
                      checkpoint_every=64)
    assert not off.enabled and off.checkpoints_for(200, 0) == ()
