"""The op graph view of llama3-8b (32 layers, dp=8 x tp=8 with sequence parallelism) in
Chromium: how long until the graph is interactive, expanding the folded layers, an op's panel.

A real `shardlab serve` (with its worker) builds the plan from the full preset; then each run
opens `#/plans/<id>/graph` in a fresh browser context (nothing cached by the browser). Times
are read from the page's own clock (`performance.now()`, 0 = navigation start) through the
marks graph.js sets, so they do not include Playwright's polling:

- drawn: the root scope's nodes are drawn with their handlers (data fetched, laid out by
  dagre in a Web Worker, SVG built);
- interactive: drawn + how long activating an op node then takes to open the side panel
  (the node is activated, and the panel checked, for real);
- expand: activating the folded `layers` node (x32) until `layers.0`'s children are drawn;
- op panel: activating one of `layers.0`'s ops until the panel shows it with its shapes.

A node is activated with Enter on it (the view handles Enter, Space and a click alike and
marks `graph:click` for each): a click needs the node inside the visible canvas, and the
first op node of a wide graph may lie beyond it.

The first run meets a cold server (the program is indexed for the first view, and the
training graph rebuilt for the first op panel's shapes; both are then cached per plan). The
shell loads Plotly (4.8 MB) only when a chart view first needs it, so this view never waits
for it.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import Section
from bench.ui_server import UiServer, chromium, login, ui_server

RUNS = 5
GOAL_S = 2.0
CLUSTER = "h100-sxm-8x8"
STRATEGY = {
    "name": "bench-dp8-tp8-sp",
    "mesh": "dp=8,tp=8",
    "templates": ["dp", "megatron_tp", "sequence_parallel"],
}
TIMEOUT_MS = 60_000


def _marks(page: Any, name: str) -> list[float]:
    """Seconds since navigation start of every `name` mark, in order."""
    found = page.evaluate(
        "(name) => performance.getEntriesByName(name, 'mark').map((m) => m.startTime)", name
    )
    return [float(t) / 1e3 for t in found]


def _one_run(browser: Any, state: Path, url: str) -> dict[str, float]:
    context = browser.new_context(storage_state=str(state), viewport={"width": 1400, "height": 900})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(url, wait_until="commit")
        page.locator(".gr-box svg[data-state=ready]").wait_for(timeout=TIMEOUT_MS)
        (shell,) = _marks(page, "graph:render")
        (drawn,) = _marks(page, "graph:drawn")
        op = page.locator(".gr-node[data-kind=op]").first
        name = op.get_attribute("data-id")
        op.press("Enter")  # activates like a click, wherever the node lies on the canvas
        page.locator(".panel h2", has_text=str(name)).wait_for(timeout=TIMEOUT_MS)
        click = _marks(page, "graph:click")[-1]
        response = _marks(page, "graph:panel")[-1] - click
        page.locator(f'.panel[data-op="{name}"][data-complete]').wait_for(timeout=TIMEOUT_MS)
        shapes = _marks(page, "graph:panel-complete")[-1] - click
        nodes = page.locator(".gr-node").count()
        layout_ms = float(page.locator(".gr-box svg").get_attribute("data-layout-ms") or "nan")

        page.locator('.gr-node[data-id="layers"]').press("Enter")
        page.locator('.gr-box svg[data-scope="layers.0"][data-state=ready]').wait_for(
            timeout=TIMEOUT_MS
        )
        expanded = _marks(page, "graph:drawn")[-1] - _marks(page, "graph:click")[-1]
        inner = page.locator(".gr-node").count()

        target = page.locator('.gr-node[data-kind=op][data-id^="layers.0."]').first
        name = target.get_attribute("data-id")
        target.press("Enter")
        page.locator(f'.panel[data-op="{name}"][data-complete]').wait_for(timeout=TIMEOUT_MS)
        panel = _marks(page, "graph:panel-complete")[-1] - _marks(page, "graph:click")[-1]
        if errors:
            raise RuntimeError(f"page errors: {errors}")
        return {
            "shell": shell,
            "drawn": drawn,
            "interactive": drawn + response,
            "click": response,
            "shapes": shapes,
            "expand": expanded,
            "panel": panel,
            "nodes": nodes,
            "inner": inner,
            "layout_ms": layout_ms,
        }
    finally:
        context.close()


def _api_ms(server: UiServer, path: str) -> float:
    request = urllib.request.Request(
        server.url + path, headers={"Authorization": f"Bearer {server.token}"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()
    return (time.perf_counter() - start) * 1e3


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms"


def run() -> Section:
    section = Section(
        "Op graph view in Chromium (llama3-8b, dp=8,tp=8 + sequence parallel)",
        ["measure", "median", "best", "first run (cold server)", "goal"],
    )
    with ui_server() as server, chromium() as browser, tempfile.TemporaryDirectory() as tmp:
        state = login(browser, server, Path(tmp) / "state.json")
        plan, build_s = server.create_plan("llama3-8b", "llama3-8b", {}, STRATEGY, CLUSTER)
        plan_id = plan["id"]
        ops = plan["summary"]["program_ops"]
        url = f"{server.url}/#/plans/{plan_id}/graph"
        runs = [_one_run(browser, state, url) for _ in range(RUNS)]
        api_root = statistics.median(
            _api_ms(server, f"/api/plans/{plan_id}/graph") for _ in range(5)
        )
        api_search = statistics.median(
            _api_ms(server, f"/api/plans/{plan_id}/graph/search?q=q_proj") for _ in range(5)
        )

    def row(label: str, key: str, of: list[dict[str, float]] = runs, goal: str = "") -> None:
        values = [r[key] for r in of]
        first = _ms(values[0])
        section.rows.append([label, _ms(statistics.median(values)), _ms(min(values)), first, goal])

    goal = f"< {GOAL_S * 1e3:.0f} ms"
    row("navigation → shell ready, graph view starts", "shell")
    row("navigation → root nodes drawn", "drawn")
    row(
        "navigation → interactive (nodes drawn + a click opens an op's panel)",
        "interactive",
        goal=goal,
    )
    row(
        "view start → interactive (the graph view's own share)",
        "view",
        [{"view": r["interactive"] - r["shell"]} for r in runs],
    )
    row("click on a root op → its panel with shapes", "shapes")
    row("expand the folded layers (x32) → layers.0 drawn", "expand")
    row("open an op's panel in layers.0 (with shapes)", "panel")
    median = statistics.median(r["interactive"] for r in runs)
    section.notes.append(
        f"{RUNS} runs each, in fresh browser contexts (cold browser cache); plan {plan_id}: "
        f"{ops:,} program ops, built by the worker in {build_s:.1f} s. Root scope: "
        f"{runs[0]['nodes']:.0f} nodes; layers.0: {runs[0]['inner']:.0f} nodes; dagre layout "
        f"in the worker {statistics.median(r['layout_ms'] for r in runs):.1f} ms (median, "
        f"root). Server side, warm: GET /graph (root) {api_root:.1f} ms, GET /graph/search "
        f"{api_search:.1f} ms (median of 5, loopback). Goal, interactive < {GOAL_S:g} s: "
        f"{'met' if median < GOAL_S else 'missed'} ({_ms(median)})."
    )
    return section


if __name__ == "__main__":
    print(run().markdown())
