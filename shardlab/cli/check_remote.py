"""`shardlab check --server`: the CI gate through a Shardlab service's REST API. Queues a
check (`POST /api/checks`), waits for its plan, and hands back the verdict, its Markdown
and its JUnit XML. Standard library only (urllib), so a CI runner needs nothing else."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from shardlab.errors import ShardlabError

FINAL = ("succeeded", "failed", "cancelled", "timed_out")


class RemoteError(ShardlabError):
    """The service refused the check or could not be reached."""

    code = "remote_check"


def run_remote_check(
    server: str, token: str, body: dict[str, Any], timeout_s: float, poll_s: float = 1.0
) -> tuple[dict[str, Any], str]:
    """Queue `body` as a check on `server`, wait (at most `timeout_s`) for its plan, and
    return the check's JSON and its JUnit XML. A RemoteError for a refusal (its message is
    the service's), a failed plan, or a timeout."""
    base = server.rstrip("/")
    created = _call(base, token, "POST", "/api/checks", body)
    path = f"/api/checks/{created['id']}"
    deadline = time.monotonic() + timeout_s
    while True:
        check = _call(base, token, "GET", path)
        if check["status"] in FINAL:
            break
        if time.monotonic() > deadline:
            raise RemoteError(f"check {created['id']} is still {check['status']} after "
                              f"{timeout_s:g} s", check_id=created["id"])  # fmt: skip
        time.sleep(poll_s)
    if check["status"] != "succeeded":
        error = (check.get("error") or {}).get("message", check["message"])
        raise RemoteError(f"check {created['id']}'s plan {check['status']}: {error}")
    return check, _call(base, token, "GET", f"{path}/junit", raw=True)


def _call(
    base: str, token: str, method: str, path: str, body: Any = None, raw: bool = False
) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read().decode())["message"]
        except (ValueError, KeyError):
            message = f"HTTP {exc.code}"
        raise RemoteError(f"{method} {path}: {exc.code} {message}", status=exc.code) from None
    except OSError as exc:
        raise RemoteError(f"cannot reach {base}: {exc}") from None
    return text if raw else json.loads(text)
