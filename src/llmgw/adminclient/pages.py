"""The cursor of a paged list's next page, read from its answer's `Link` header.

`GET /admin/keys` and `GET /admin/models` answer in pages (docs/controller.md,
"Pages"): a page that is not the last carries `Link: <PATH?after=NAME&limit=N>;
rel="next"` (RFC 8288). The client asks for the next page itself, with the `after`
read here, rather than following the link's URL: the controller names a cursor, never
where the token goes next.
"""

from __future__ import annotations

import re
import urllib.parse

# The most pages one list is read in: ten million rows at the controller's default page
# size, and a bound on a controller whose cursors advance without end.
MAX_PAGES = 10_000

# One link-value of a Link header: `<target>` and its parameters up to the next comma
# outside the brackets (targets here never hold a comma; names cannot).
_LINK = re.compile(r"<([^>]*)>((?:\s*;\s*[^,;]*)*)")
_NEXT = re.compile(r'(?:^|;)\s*rel\s*=\s*"?next"?\s*(?:;|$)', re.IGNORECASE)


def next_after(link: str | None) -> str | None:
    """The `after` of the rel="next" link in `link`; None when there is none (the last
    page, or a controller from before pages), "" when the link names no cursor."""
    for m in _LINK.finditer(link or ""):
        if _NEXT.search(m.group(2)):
            query = urllib.parse.urlsplit(m.group(1)).query
            return urllib.parse.parse_qs(query).get("after", [""])[0]
    return None
