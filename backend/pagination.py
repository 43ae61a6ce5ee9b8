"""Lists the API pages through: `?limit=&offset=`, the total in an `X-Total-Count` header
and the next page's address in a `Link` header (`rel="next"`, RFC 8288), as GitHub's API
does. The body stays a plain JSON list, so a client that reads one page needs nothing new.

`Page` is the dependency a list route takes; `page.rows(session, query)` runs the query for
that page (the query's own order decides what "next" means) and sets the headers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Query, Request, Response
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

#: Rows a list answers with when the client does not say.
DEFAULT_LIMIT = 100
#: The most rows one page holds.
MAX_LIMIT = 1000
#: The largest offset: no list holds more rows than a 32-bit id counts (a larger number
#: would overflow the databases' 64-bit integers past 2^63: a 422, never a 500)
MAX_OFFSET = 2**31 - 1
TOTAL_HEADER = "X-Total-Count"


@dataclass
class PageWindow:
    """One page of a list: where it starts, how long it is, and the response to mark."""

    limit: int
    offset: int
    request: Request
    response: Response

    def rows(self, session: Session, query: Select[Any]) -> list[Any]:
        """The page's rows of `query` (ordered), with the total and the next page's link."""
        return list(session.scalars(self.window(session, query)))

    def headers(self) -> dict[str, str]:
        """The page's headers (total, next link), for a route that answers a Response."""
        names = (TOTAL_HEADER.lower(), "link")
        return {k: v for k, v in self.response.headers.items() if k.lower() in names}

    def window(self, session: Session, query: Select[Any]) -> Select[Any]:
        """`query` limited to this page; counts its rows for the total and the next link."""
        total = session.scalar(select(func.count()).select_from(query.order_by(None).subquery()))
        self.count(total or 0)
        return query.limit(self.limit).offset(self.offset)

    def count(self, total: int) -> None:
        """Set the total and, where more follow, the next page's link."""
        self.response.headers[TOTAL_HEADER] = str(total)
        if self.offset + self.limit < total:
            following = self.request.url.include_query_params(
                limit=self.limit, offset=self.offset + self.limit
            )
            self.response.headers["Link"] = f'<{following}>; rel="next"'


def pages(default: int, most: int, unit: str = "Rows") -> Callable[..., Awaitable[PageWindow]]:
    """A page dependency with its own page size: `default` rows unless asked, `most` at
    most (`Page` is the lists'; large documents page by their own unit, e.g. ops):
    `Annotated[PageWindow, Depends(pages(...))]`."""

    # defaults, not Annotated: the annotations are strings here (`from __future__`), and
    # FastAPI could not resolve `most` and `unit` in them
    async def page(  # async: no I/O, so no thread hop
        request: Request,
        response: Response,
        limit: int = Query(default, ge=1, le=most, description=f"{unit} per page, 1 to {most}."),
        offset: int = Query(0, ge=0, le=MAX_OFFSET, description=f"{unit} to skip."),
    ) -> PageWindow:
        return PageWindow(limit, offset, request, response)

    return page


Page = Annotated[PageWindow, Depends(pages(DEFAULT_LIMIT, MAX_LIMIT))]
