"""Lists the API pages through: `?limit=&offset=`, the total in an `X-Total-Count` header
and the next page's address in a `Link` header (`rel="next"`, RFC 8288), as GitHub's API
does. The body stays a plain JSON list, so a client that reads one page needs nothing new.

`Page` is the dependency a list route takes; `page.rows(session, query)` runs the query for
that page (the query's own order decides what "next" means) and sets the headers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Query, Request, Response
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

#: Rows a list answers with when the client does not say.
DEFAULT_LIMIT = 100
#: The most rows one page holds.
MAX_LIMIT = 1000
TOTAL_HEADER = "X-Total-Count"


@dataclass
class _Page:
    """One page of a list: where it starts, how long it is, and the response to mark."""

    limit: int
    offset: int
    request: Request
    response: Response

    def rows(self, session: Session, query: Select[Any]) -> list[Any]:
        """The page's rows of `query` (ordered), with the total and the next page's link."""
        total = session.scalar(select(func.count()).select_from(query.order_by(None).subquery()))
        self.response.headers[TOTAL_HEADER] = str(total or 0)
        if self.offset + self.limit < (total or 0):
            following = self.request.url.include_query_params(
                limit=self.limit, offset=self.offset + self.limit
            )
            self.response.headers["Link"] = f'<{following}>; rel="next"'
        return list(session.scalars(query.limit(self.limit).offset(self.offset)))


def _page(
    request: Request,
    response: Response,
    limit: Annotated[
        int, Query(ge=1, le=MAX_LIMIT, description=f"Rows per page, 1 to {MAX_LIMIT}.")
    ] = DEFAULT_LIMIT,
    offset: Annotated[int, Query(ge=0, description="Rows to skip.")] = 0,
) -> _Page:
    return _Page(limit, offset, request, response)


Page = Annotated[_Page, Depends(_page)]
