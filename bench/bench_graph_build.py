"""Time to build forward graphs of the largest presets (llama3-70b has 80 layers)."""

from __future__ import annotations

from bench.common import Section, ms, time_it
from shardlab.models import build_model
from shardlab.validate import validate_graph


def run() -> Section:
    section = Section(
        "Building forward graphs",
        ["model", "layers", "ops", "build (best)", "build (median)", "build + validate (best)"],
    )
    timings = {}
    for name, overrides in [
        ("llama3-8b", {}),
        ("llama3-70b", {"layers": 40}),
        ("llama3-70b", {}),
        ("gpt2-xl", {}),
    ]:
        graph = build_model(name, overrides)
        t = time_it(lambda n=name, o=overrides: build_model(n, o))
        tv = time_it(lambda n=name, o=overrides: validate_graph(build_model(n, o)))
        layers = overrides.get("layers", graph.meta["config"]["layers"])
        timings[(name, layers)] = t.best
        section.rows.append(
            [name, str(layers), str(len(graph.ops)), ms(t.best), ms(t.median), ms(tv.best)]
        )
    ratio = timings[("llama3-70b", 80)] / timings[("llama3-70b", 40)]
    section.notes.append(
        f"llama3-70b: 80-layer / 40-layer build time = {ratio:.2f} (2.00 is linear), "
        "measured in the same run."
    )
    return section
