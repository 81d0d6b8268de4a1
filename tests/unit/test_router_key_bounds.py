"""What keying a request may cost: a body of many tiny items is read only as far as routing goes."""

from __future__ import annotations

from typing import Any

from llmgw.router.apis import conversation
from llmgw.router.routing.blockhash import MAX_ROUTED_ITEMS, request_block_hashes

# Past the routed items, a tail of them (long enough to fill blocks) that must change nothing.
TAIL = MAX_ROUTED_ITEMS


def turns(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{i % 10}"} for i in range(n)]


class TestManyTinyItems:
    """Each message and content part counts at least a unit of the routed bytes."""

    def test_messages_past_the_routed_items_are_not_read(self) -> None:
        """A chat of tiny messages is keyed on its first MAX_ROUTED_ITEMS messages."""
        cut = {"model": "m", "messages": turns(MAX_ROUTED_ITEMS)}
        more = {"model": "m", "messages": turns(MAX_ROUTED_ITEMS + TAIL)}
        assert request_block_hashes(cut) == request_block_hashes(more)

    def test_parts_past_the_routed_items_are_not_read(self) -> None:
        """A message of tiny content parts is keyed on its first MAX_ROUTED_ITEMS parts."""
        parts = [{"type": "text", "text": f"{i % 10}"} for i in range(MAX_ROUTED_ITEMS + TAIL)]
        cut = {"model": "m", "messages": [{"role": "user", "content": parts[:MAX_ROUTED_ITEMS]}]}
        more = {"model": "m", "messages": [{"role": "user", "content": parts}]}
        assert request_block_hashes(cut) == request_block_hashes(more)

    def test_parts_count_across_messages(self) -> None:
        """Tiny parts spread over several messages share one bound: later messages add nothing."""
        parts = [0] * MAX_ROUTED_ITEMS
        one = {"model": "m", "messages": [{"role": "user", "content": parts}]}
        two = {
            "model": "m",
            "messages": [{"role": "user", "content": parts}, {"role": "user", "content": parts}],
        }
        assert request_block_hashes(one) == request_block_hashes(two)

    def test_ordinary_chats_are_read_whole(self) -> None:
        """A conversation of messages longer than a unit is keyed to its last message."""
        long = [{"role": "user", "content": "x" * 100 + str(i)} for i in range(100)]
        changed = [*long[:-1], {"role": "user", "content": "y" * 100}]
        a = request_block_hashes({"model": "m", "messages": long})
        b = request_block_hashes({"model": "m", "messages": changed})
        assert a[:-1] == b[:-1]
        assert a[-1] != b[-1]


class TestConversationsOfManyItems:
    """The Responses and Messages APIs' turns are rewritten only as far as routing reads."""

    def test_responses_input_is_rewritten_up_to_the_routed_items(self) -> None:
        """A Responses `input` of millions of tiny items gives at most MAX_ROUTED_ITEMS turns."""
        doc = {"model": "m", "instructions": "be brief", "input": [0] * (4 * MAX_ROUTED_ITEMS)}
        assert len(conversation.responses_messages(doc)) <= MAX_ROUTED_ITEMS + 1

    def test_messages_are_rewritten_up_to_the_routed_items(self) -> None:
        """Anthropic `messages` of millions of tiny items give at most MAX_ROUTED_ITEMS turns."""
        doc = {"model": "m", "system": "be brief", "messages": [0] * (4 * MAX_ROUTED_ITEMS)}
        assert len(conversation.messages_messages(doc)) <= MAX_ROUTED_ITEMS + 1

    def test_content_parts_are_rewritten_up_to_the_routed_items(self) -> None:
        """One turn of millions of tiny parts keeps at most MAX_ROUTED_ITEMS of them."""
        turn = {"role": "user", "content": [0] * (4 * MAX_ROUTED_ITEMS)}
        (got,) = conversation.messages_messages({"model": "m", "messages": [turn]})
        assert len(got["content"]) <= MAX_ROUTED_ITEMS

    def test_a_cut_conversation_keys_as_its_chat(self) -> None:
        """Cut or not, a Responses request keys exactly as the chat request of its turns."""
        items = [{"role": "user", "content": f"{i % 10}"} for i in range(MAX_ROUTED_ITEMS + TAIL)]
        key = conversation.responses_key({"model": "m", "input": items}, None)
        assert key.hashes == request_block_hashes({"model": "m", "messages": items})
