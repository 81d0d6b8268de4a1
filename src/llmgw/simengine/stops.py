"""Stop strings: where a reply's text ends, found as it is generated (vLLM's StopChecker).

After each generated token the new text is searched for each stop string, in the
request's order, where one could end in it; the first found ends the request
(finish_reason "stop") and the reply's text ends before it, or after it with
`include_stop_str_in_output`. Text after it, in the token that completed it, is never
written. Without `include_stop_str_in_output` a stream holds back the last
`longest - 1` characters until more text or the end comes, so no start of a stop string
is written before it is known not to be one (vLLM's output_text_buffer_length).
"""

from __future__ import annotations


class StopScan:
    """One request's stop strings and the tail of its text still able to begin one."""

    __slots__ = ("_keep", "_tail", "holdback", "include", "length", "stops")

    def __init__(self, stops: tuple[str, ...], *, include: bool) -> None:
        self.stops = stops
        self.include = include
        longest = max(len(s) for s in stops)
        self._keep = longest - 1
        # Characters a stream holds back from a reply not finished yet.
        self.holdback = 0 if include else self._keep
        self._tail = ""
        self.length = 0  # characters of text fed

    def feed(self, text: str, *, check: bool = True) -> tuple[str, int] | None:
        """Add generated `text`: the stop string that ends the reply and the length of the
        reply's text (the characters kept), or None when none is complete yet (or when
        not to `check`: vLLM looks for none until `min_tokens` are generated)."""
        self.length += len(text)
        tail = self._tail + text
        new_at = len(tail) - len(text)
        for s in self.stops if check and text else ():
            i = tail.find(s, max(new_at - len(s) + 1, 0))
            if i >= 0:
                end = self.length - len(tail) + i
                return s, (end + len(s) if self.include else end)
        self._tail = tail[len(tail) - self._keep :] if self._keep else ""
        return None
