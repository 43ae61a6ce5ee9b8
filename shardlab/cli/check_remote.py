"""`shardlab check --server`: the CI gate through a Shardlab service's REST API. Queues a
check (`POST /api/checks`), waits for its plan, and hands back the verdict, its Markdown
and its JUnit XML. The model and strategy are stored ones (ids) or named in the request (a
preset with overrides, a strategy inline), so a fresh team's CI needs only a token.
Standard library only (urllib), so a CI runner needs nothing else."""

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


def model_ref(
    model_id: int | None, preset: str | None, overrides: dict[str, str]
) -> dict[str, Any]:
    """The check body's model: a stored `model_id`, or `model` by preset with its overrides
    (the service reuses the team's model of the same preset and overrides)."""
    if (model_id is None) == (preset is None):
        raise RemoteError("--server needs the model: --model-id N, or --preset NAME "
                          "(with --set key=value)")  # fmt: skip
    if preset is None:
        if overrides:
            raise RemoteError("--set applies to --preset, not to --model-id")
        return {"model_id": model_id}
    return {"model": {"preset": preset, "overrides": overrides}}


def strategy_ref(
    strategy_id: int | None, mesh: str | None, name: str | None, definition: dict[str, Any]
) -> dict[str, Any]:
    """The check body's strategy: a stored `strategy_id`, or `strategy` inline (`definition`:
    templates, annotations, options; the service reuses the latest version of `name`, or of
    a name it derives from mesh and templates, when identical, else adds the next)."""
    if (strategy_id is None) == (mesh is None):
        raise RemoteError("--server needs the strategy: --strategy-id M, or --mesh (with "
                          "--template, --annotate, ...)")  # fmt: skip
    if mesh is None:
        if name is not None or any(definition.values()):
            raise RemoteError("--strategy-name, --template, --annotate and --recompute "
                              "apply to --mesh, not to --strategy-id")  # fmt: skip
        return {"strategy_id": strategy_id}
    named = {"name": name} if name is not None else {}
    return {"strategy": {**named, "mesh": mesh, **definition}}


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
