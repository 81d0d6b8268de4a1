"""sim-engine tokenizer: the documented rules, exactly."""

from __future__ import annotations

import zlib

from llmgw.simengine import tokenizer as tok


class TestTokenize:
    """The sim-engine tokenizer's documented rules."""

    def test_four_code_points_per_token(self) -> None:
        """Text is cut into 4-code-point pieces; the last one may be shorter."""
        assert [tok.piece_id("abcd"), tok.piece_id("ef")] == tok.tokenize("abcdef")

    def test_piece_id_is_crc32_offset(self) -> None:
        """A piece's id is FIRST_TEXT_ID + crc32(utf-8) mod TEXT_ID_RANGE."""
        expected = tok.FIRST_TEXT_ID + zlib.crc32("héé!".encode()) % tok.TEXT_ID_RANGE
        assert [expected] == tok.tokenize("héé!")

    def test_empty_text_has_no_tokens(self) -> None:
        """The empty string tokenizes to nothing."""
        assert tok.tokenize("") == []

    def test_ids_stay_in_the_vocabulary(self) -> None:
        """Every text id is at or above FIRST_TEXT_ID and below VOCAB_SIZE."""
        ids = tok.tokenize("the quick brown fox jumps over the lazy dog" * 20)
        assert all(tok.FIRST_TEXT_ID <= i < tok.VOCAB_SIZE for i in ids)


class TestChatPrompt:
    """The chat prompt layout."""

    def test_layout(self) -> None:
        """BOS, role opener, content, END per message, then the generation prompt."""
        ids = tok.chat_prompt_ids([{"role": "user", "content": "hi"}])
        assert [tok.BOS, tok.ROLE_IDS["user"], tok.piece_id("hi"), tok.END, 12] == ids

    def test_next_turn_extends_the_prompt(self) -> None:
        """A conversation's prompt is a token prefix of its next turn's prompt."""
        turn1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q1"}]
        reply = tok.output_text(tok.OUTPUT_IDS[:5])
        turn2 = [*turn1, {"role": "assistant", "content": reply}, {"role": "user", "content": "q2"}]
        first = tok.chat_prompt_ids(turn1)
        assert first == tok.chat_prompt_ids(turn2)[: len(first)]

    def test_reply_retokenizes_to_generated_ids(self) -> None:
        """Generated text tokenizes back to exactly the ids that produced it."""
        ids = [tok.OUTPUT_IDS[i % 64] for i in range(0, 300, 7)]
        assert ids == tok.tokenize(tok.output_text(ids))

    def test_tools_come_first_canonically(self) -> None:
        """Tool definitions are canonical JSON, so key order does not change the tokens."""
        a = tok.chat_prompt_ids([], [{"type": "function", "function": {"name": "f", "x": 1}}])
        b = tok.chat_prompt_ids([], [{"function": {"x": 1, "name": "f"}, "type": "function"}])
        assert (a, a[1]) == (b, tok.TOOLS)

    def test_content_parts_are_joined(self) -> None:
        """Text parts count as their text; a parts list equals the same string."""
        parts = [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]
        assert tok.chat_prompt_ids([{"role": "user", "content": "abcd"}]) == tok.chat_prompt_ids(
            [{"role": "user", "content": parts}]
        )

    def test_unknown_role_is_spelled_out(self) -> None:
        """A role not in ROLE_IDS opens with ROLE_OTHER and the role's tokens."""
        ids = tok.message_ids({"role": "critic", "content": ""})
        assert [tok.ROLE_OTHER, *tok.tokenize("critic"), tok.END] == ids

    def test_role_matters(self) -> None:
        """The same content under two roles gives different tokens."""
        u = tok.chat_prompt_ids([{"role": "user", "content": "x"}])
        s = tok.chat_prompt_ids([{"role": "system", "content": "x"}])
        assert u != s


class TestBody:
    """Prompts taken from request bodies."""

    def test_completion_string_gets_bos(self) -> None:
        """A completions prompt string is BOS followed by its text tokens."""
        assert [tok.BOS, *tok.tokenize("hello")] == tok.prompt_ids_for_body({"prompt": "hello"})

    def test_completion_ids_are_used_as_is(self) -> None:
        """A prompt given as token ids is not changed."""
        assert tok.prompt_ids_for_body({"prompt": [5, 6, 7]}) == [5, 6, 7]

    def test_single_prompt_in_a_list(self) -> None:
        """A one-element prompt list is that prompt."""
        assert tok.prompt_ids_for_body({"prompt": "a"}) == tok.prompt_ids_for_body(
            {"prompt": ["a"]}
        )

    def test_chat_body(self) -> None:
        """A chat body uses its messages and tools."""
        body = {"messages": [{"role": "user", "content": "q"}], "tools": None}
        assert tok.chat_prompt_ids(body["messages"]) == tok.prompt_ids_for_body(body)


class TestOutputText:
    """Text rendered from generated tokens."""

    def test_end_renders_nothing(self) -> None:
        """END ends a reply without adding text."""
        assert tok.output_text([tok.OUTPUT_IDS[0], tok.END]) == "the "

    def test_pieces_are_four_chars(self) -> None:
        """Every output piece is exactly one token long."""
        assert {4} == {len(p) for p in tok.OUTPUT_PIECES}
