"""Stored chat completions (``store: true``) through the official OpenAI client: retrieve,
list with filters and pages, update metadata, the messages, delete; streamed ones too."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import httpx
import openai
import pytest
from serverproc import ServerProcess

from edgeinfer.service.chat_store import ChatStore, Query

HELLO = [{"role": "system", "content": "Be brief."},
         {"role": "user", "content": "Say hello."}]


def test_a_stored_completion_is_retrieved_listed_updated_and_deleted(
        client: openai.OpenAI) -> None:
    tag = uuid.uuid4().hex  # this run's, so earlier runs' stored completions do not count
    made = client.chat.completions.create(model="default", messages=HELLO,  # type: ignore
                                          max_tokens=8, temperature=0, store=True,
                                          metadata={"run": tag, "kind": "whole"})
    got = client.chat.completions.retrieve(made.id)
    assert got.id == made.id and got.choices[0].message.content == made.choices[0].message.content
    assert got.model == made.model and got.usage == made.usage
    assert got.metadata == {"run": tag, "kind": "whole"}
    msgs = client.chat.completions.messages.list(made.id)
    assert [(m.role, m.content) for m in msgs.data] == [(m["role"], m["content"]) for m in HELLO]
    assert [m.id for m in msgs.data] == [f"{made.id}-0", f"{made.id}-1"]
    assert [m.id for m in client.chat.completions.messages.list(made.id, order="desc",
                                                                limit=1).data] == [f"{made.id}-1"]

    # a streamed answer is stored whole once the stream has ended
    parts = list(client.chat.completions.create(  # type: ignore[call-overload]
        model="default", messages=HELLO, max_tokens=8, temperature=0, stream=True,
        store=True, metadata={"run": tag, "kind": "streamed"}))
    streamed = client.chat.completions.retrieve(parts[0].id)
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert streamed.choices[0].message.content == text
    assert streamed.choices[0].finish_reason == parts[-1].choices[0].finish_reason

    # not stored without store: true
    plain = client.chat.completions.create(model="default", messages=HELLO, max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(plain.id)

    # the list: filtered by metadata, oldest first, in pages
    mine = client.chat.completions.list(metadata={"run": tag})
    assert [c.id for c in mine.data] == [made.id, streamed.id] and not mine.has_more
    first = client.chat.completions.list(metadata={"run": tag}, limit=1, order="desc")
    assert [c.id for c in first.data] == [streamed.id] and first.has_more
    rest = client.chat.completions.list(metadata={"run": tag}, limit=1, order="desc",
                                        after=streamed.id)
    assert [c.id for c in rest.data] == [made.id] and not rest.has_more
    assert [c.id for c in client.chat.completions.list(
        metadata={"run": tag, "kind": "streamed"}).data] == [streamed.id]
    assert not client.chat.completions.list(metadata={"run": tag}, model="nobody").data
    assert [c.id for c in client.chat.completions.list(
        metadata={"run": tag}, model=made.model).data] == [made.id, streamed.id]

    # metadata replaced, then the completion deleted
    updated = client.chat.completions.update(made.id, metadata={"run": tag, "kind": "new"})
    assert updated.metadata == {"run": tag, "kind": "new"}
    assert [c.id for c in client.chat.completions.list(
        metadata={"run": tag, "kind": "new"}).data] == [made.id]
    gone = client.chat.completions.delete(made.id)
    assert gone.deleted and gone.id == made.id and gone.object == "chat.completion.deleted"
    for call in (lambda: client.chat.completions.retrieve(made.id),
                 lambda: client.chat.completions.delete(made.id),
                 lambda: client.chat.completions.messages.list(made.id)):
        with pytest.raises(openai.NotFoundError):
            call()


def test_bad_list_and_update_requests_are_400s(server: ServerProcess) -> None:
    url = f"{server.base_url}/v1/chat/completions"
    for query in ("limit=0", "limit=101", "limit=x", "limit=²", "order=up",
                  "after=chatcmpl-none"):
        r = httpx.get(f"{url}?{query}", timeout=30)
        assert r.status_code == 400, (query, r.text)
        assert r.json()["error"]["param"] == query.split("=")[0]
    made = httpx.post(url, json={"model": "default", "messages": HELLO, "max_tokens": 2,
                                 "store": True}, timeout=60).json()
    for body in ({}, {"metadata": {"k": 5}}, {"metadata": "x"}):
        r = httpx.post(f"{url}/{made['id']}", json=body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "metadata", r.text
    assert httpx.post(f"{url}/chatcmpl-none", json={"metadata": {}}, timeout=30
                      ).status_code == 404
    assert httpx.get(f"{url}/{made['id']}/messages?after=nope", timeout=30).status_code == 400


def test_the_chat_store_keeps_its_bounds_and_owners(tmp_path: Path) -> None:
    async def run() -> None:
        store = ChatStore(tmp_path / "c.sqlite3", max_rows=3)
        for i in range(5):
            assert await store.put("o", {"id": f"c{i}", "model": "m"}, [{"role": "user"}])
        page = await store.page("o", Query())
        assert page is not None and [c["id"] for c in page.data] == ["c2", "c3", "c4"]
        assert await store.get("other", "c4") is None and not await store.delete("x", "c4")
        other = await store.page("other", Query())
        assert other is not None and other.data == []
        assert await store.page("o", Query(after="c0")) is None  # removed: no cursor
        assert await store.messages("o", "c4") == [{"id": "c4-0", "role": "user"}]
        # a client deleting what it lists, page by page: the next page's cursor is gone
        first = await store.page("o", Query(limit=1))
        assert first is not None and [c["id"] for c in first.data] == ["c2"] and first.has_more
        assert await store.delete("o", "c2") and not await store.delete("o", "c2")
        after = await store.page("o", Query(limit=1, after="c2"))
        assert after is not None and [c["id"] for c in after.data] == ["c3"]
        assert await store.get("o", "c2") is None and await store.messages("o", "c2") is None
        # listed in the order they were created, not stored (a stream is stored at its end)
        ordered = ChatStore(tmp_path / "o.sqlite3")
        for cid in ("c3", "c4"):
            assert await ordered.put("o", {"id": cid}, [])
        early = {"id": "early", "created": int(time.time()) - 100, "metadata": {"k": "v"}}
        assert await ordered.put("o", early, [])
        listed = await ordered.page("o", Query())
        assert listed is not None and [c["id"] for c in listed.data] == ["early", "c3", "c4"]
        tagged = await ordered.page("o", Query(metadata=(("k", "v"),)))
        assert tagged is not None and [c["id"] for c in tagged.data] == ["early"]

    asyncio.run(run())
