"""A model at another batch size: what a pipeline needs to cut the global batch into
micro-batches.

A graph holds fixed shapes, so a model is rebuilt rather than reshaped: a preset from its
preset name and settings (`meta["preset"]`, `meta["config"]`), a model imported from a
Hugging Face config by importing the config again (`meta["hf_config"]`; torch and
transformers are imported lazily, as the first import needed them). A graph written by hand
or captured from an arbitrary module cannot be rebuilt, and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardlab.errors import PresetError
from shardlab.ir import Graph
from shardlab.models import build_model, get_preset
from shardlab.models.config import OVERRIDABLE


def model_batch(graph: Graph) -> int | None:
    """The global batch a rebuildable model was built with (None: it cannot be rebuilt)."""
    imported = _imported(graph)
    if imported is not None:
        return int(imported["batch"])
    preset, config = graph.meta.get("preset"), graph.meta.get("config")
    if isinstance(preset, str) and isinstance(config, Mapping) and config.get("batch"):
        return int(config["batch"])
    return None


def model_at_batch(graph: Graph, batch: int) -> Graph:
    """`graph`'s model rebuilt with `batch` (every other setting as it was)."""
    imported = _imported(graph)
    if imported is not None:
        from shardlab.importers.hf_config import graph_from_hf_config

        return graph_from_hf_config(
            imported["config"], batch=batch, seq=int(imported["seq"]), name=graph.name
        )
    if model_batch(graph) is None:
        raise PresetError(
            f"a pipeline (mesh axis 'pp') cuts the batch into micro-batches, so it needs a "
            f"preset or a model imported from a Hugging Face config; graph {graph.name!r} "
            "is neither",
            model=graph.name,
        )
    preset, config = graph.meta["preset"], graph.meta["config"]
    default = get_preset(preset).config
    overrides = {
        k: config[k] for k in OVERRIDABLE if k in config and getattr(default, k, None) != config[k]
    }
    return build_model(preset, {**overrides, "batch": batch})


def microbatch_model(graph: Graph, microbatches: int) -> Graph:
    """The model of one micro-batch: the global batch / `microbatches`."""
    batch = model_batch(graph)
    if batch is None:
        return model_at_batch(graph, 1)  # raises, naming the graph
    if microbatches < 1 or batch % microbatches:
        raise PresetError(
            f"batch {batch} does not split into {microbatches} micro-batches; use another "
            "batch (--set batch=..., or import with --batch) or --microbatches ...",
            batch=batch,
            microbatches=microbatches,
        )
    return model_at_batch(graph, batch // microbatches)


def _imported(graph: Graph) -> Mapping[str, Any] | None:
    imported = graph.meta.get("hf_config")
    if isinstance(imported, Mapping) and isinstance(imported.get("config"), Mapping):
        return imported
    return None
