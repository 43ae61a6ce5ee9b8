"""Run every benchmark and rewrite docs/performance.md with the figures and the machine."""

from __future__ import annotations

import datetime
import os
import platform
import sys
import traceback
from pathlib import Path

import numpy as np

from bench import (
    bench_api,
    bench_completion,
    bench_dtensor_parity,
    bench_fidelity,
    bench_graph_build,
    bench_load,
    bench_lowering,
    bench_measured,
    bench_model_states,
    bench_pass_guard,
    bench_passes,
    bench_pipeline,
    bench_recipes,
    bench_scale,
    bench_search,
    bench_ui_graph,
)
from bench.common import Section

BENCHMARKS = [
    bench_graph_build,
    bench_completion,
    bench_scale,
    bench_lowering,
    bench_passes,
    bench_pass_guard,
    bench_recipes,
    bench_model_states,
    bench_pipeline,
    bench_fidelity,
    bench_measured,
    bench_search,
    bench_dtensor_parity,
    bench_api,
    bench_load,
    bench_ui_graph,
]
OUTPUT = Path(__file__).resolve().parent.parent / "docs" / "performance.md"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"numpy {np.__version__}; {platform.system()} {platform.release()}"
    )


def main() -> int:
    """Run every benchmark; one that raises is reported in its place (and the run fails),
    so the others' figures are still written."""
    sections: list[Section] = []
    failed = []
    for module in BENCHMARKS:
        print(f"running {module.__name__} ...", flush=True)
        try:
            sections.append(module.run())
        except Exception as exc:  # reported in the document and the exit code
            failed.append(module.__name__)
            traceback.print_exc()
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            sections.append(Section(f"{module.__name__} FAILED", ["error"], [[error[:300]]]))
    today = datetime.date.today().isoformat()
    text = [
        "# Performance",
        "",
        f"Written by `make bench` on {today}. Machine: {machine()}.",
        "Times are wall clock; ratios compare figures measured in the same run.",
        "",
    ]
    text += [s.markdown() for s in sections]
    OUTPUT.parent.mkdir(exist_ok=True)
    OUTPUT.write_text("\n".join(text))
    print(f"wrote {OUTPUT}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
