"""AdminClient follows the pages of `GET /admin/keys` and `/admin/models` (no socket)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable

import msgspec
import pytest

from llmgw.adminclient.client import AdminClient, Response
from llmgw.adminclient.errors import AdminServerFailed
from llmgw.adminclient.pages import MAX_PAGES, next_after


def _key(name: str) -> dict[str, object]:
    return {"name": name, "team": "t", "created_at": 1.0}


class Paged:
    """A controller's paged list of `names`, `limit` to a page (None: an old controller,
    which answers everything and sends no Link)."""

    def __init__(self, names: list[str], limit: int | None = 2) -> None:
        self.names = names
        self.limit = limit
        self.asked: list[dict[str, str]] = []

    def request(self, method: str, url: str, **_kw: object) -> Response:
        split = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(split.query))
        self.asked.append(query)
        if self.limit is None:
            return Response(200, msgspec.json.encode([_key(n) for n in self.names]))
        limit = int(query.get("limit", self.limit))
        rest = [n for n in self.names if n > query.get("after", "")]
        rows = rest[:limit]
        link = None
        if len(rest) > limit:
            target = urllib.parse.urlencode({"after": rows[-1], "limit": limit})
            link = f'<{split.path}?{target}>; rel="next"'
        return Response(200, msgspec.json.encode([_key(n) for n in rows]), link=link)


class Hostile:
    """Answers every page with the same rows and a Link made by `link(page number)`."""

    def __init__(self, link: Callable[[int], str]) -> None:
        self.link = link
        self.pages = 0

    def request(self, method: str, url: str, **_kw: object) -> Response:
        self.pages += 1
        return Response(200, msgspec.json.encode([_key("a")]), link=self.link(self.pages))


class TestFollowingPages:
    """keys() and models() return every row, whatever the page size."""

    def test_every_page_is_followed_in_order(self) -> None:
        """Five keys in pages of two: three requests, every key once."""
        t = Paged(["a", "b", "c", "d", "e"])
        got = AdminClient("http://c", transport=t).keys()
        assert [k.name for k in got] == ["a", "b", "c", "d", "e"]
        assert t.asked == [{}, {"after": "b"}, {"after": "d"}]

    def test_answer_is_the_whole_list(self) -> None:
        """`answer` (what `ctl -o json` prints) holds every page's rows as one list."""
        client = AdminClient("http://c", transport=Paged(["a", "b", "c"]))
        client.keys()
        assert client.answer == [_key("a"), _key("b"), _key("c")]

    def test_page_size_is_sent_as_limit(self) -> None:
        """page_size asks for pages of that size, on every request."""
        t = Paged(["a", "b", "c"])
        AdminClient("http://c", transport=t).keys(page_size=2)
        assert t.asked == [{"limit": "2"}, {"after": "b", "limit": "2"}]

    def test_an_old_controller_answers_in_one_request(self) -> None:
        """No Link (a controller from before pages): the one answer is the whole list,
        and no query parameter it would refuse was sent."""
        t = Paged(["a", "b", "c"], limit=None)
        got = AdminClient("http://c", transport=t).keys()
        assert [k.name for k in got] == ["a", "b", "c"]
        assert t.asked == [{}]


class TestHostileCursors:
    """A next link that does not move forward is an error, never an endless loop."""

    @pytest.mark.parametrize(
        "link",
        [
            pytest.param(lambda n: '</admin/keys?after=a>; rel="next"', id="same"),
            pytest.param(lambda n: f'</admin/keys?after={"zyx"[n % 3]}>; rel="next"', id="back"),
            pytest.param(lambda n: '</admin/keys?limit=2>; rel="next"', id="no-after"),
        ],
    )
    def test_a_cursor_that_does_not_advance_fails(self, link: Callable[[int], str]) -> None:
        """The client stops with AdminServerFailed naming the cursor."""
        t = Hostile(link)
        with pytest.raises(AdminServerFailed, match="cursor"):
            AdminClient("http://c", transport=t).keys()
        assert t.pages <= 3


class TestEndlessCursors:
    """Cursors that always advance are followed for a bounded number of pages only."""

    def test_a_list_that_never_ends_fails_after_max_pages(self) -> None:
        """`a`, `aa`, `aaa`, …: AdminServerFailed after MAX_PAGES requests."""
        t = Hostile(lambda n: f'</admin/keys?after={"a" * n}>; rel="next"')
        with pytest.raises(AdminServerFailed, match="still more pages"):
            AdminClient("http://c", transport=t).keys()
        assert t.pages == MAX_PAGES


class TestNextAfter:
    """The cursor read from a Link header."""

    @pytest.mark.parametrize(
        ("link", "expected"),
        [
            (None, None),
            ("", None),
            ('</admin/keys?after=k1&limit=5>; rel="next"', "k1"),
            ('</admin/models?after=meta-llama%2FL-3>; rel="next"', "meta-llama/L-3"),
            ('</x?after=a>; rel="prev", </x?after=b>; rel="next"', "b"),
            ("</admin/keys?after=k1>; rel=next", "k1"),
            ('</admin/keys?after=k1>; rel="prev"', None),
        ],
    )
    def test_parsed(self, link: str | None, expected: str | None) -> None:
        """rel="next"'s `after`, decoded; None when there is no next page."""
        assert next_after(link) == expected

    def test_a_next_link_without_after_is_empty_string(self) -> None:
        """A next page with no cursor is told apart from no next page."""
        assert next_after('</admin/keys?limit=2>; rel="next"') == ""
