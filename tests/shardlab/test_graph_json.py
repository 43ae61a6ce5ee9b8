"""The JSON form: exact round trips for every preset and agreement with the schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from shardlab.graph_json import graph_from_json, graph_schema, graph_to_json, loads_graph
from shardlab.models import PRESETS, build_model
from shardlab.validate import validate_graph

SMALL = {"layers": 2}


def _small(name: str):  # type: ignore[no-untyped-def]
    return build_model(name, {} if name == "mlp_demo" else SMALL)


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_round_trips_exactly(name: str) -> None:
    graph = _small(name)
    doc = graph_to_json(graph)
    text = json.dumps(doc)
    again = loads_graph(text)
    assert again == graph
    assert graph_to_json(again) == doc
    validate_graph(again)


@pytest.mark.parametrize("name", ["mlp_demo", "gpt2", "llama3-8b"])
def test_exports_validate_against_the_published_schema(name: str) -> None:
    jsonschema.validate(graph_to_json(_small(name)), graph_schema())


def test_schema_rejects_what_the_parser_rejects() -> None:
    doc = graph_to_json(_small("mlp_demo"))
    doc["values"][0]["shape"] = [0, 4]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, graph_schema())


def test_defaults_are_filled_when_parsing() -> None:
    doc = {
        "format": "shardlab.graph/1",
        "values": [
            {"name": "x", "shape": [2], "dtype": "float32", "kind": "input"},
            {"name": "y", "shape": [2], "dtype": "float32"},
        ],
        "ops": [{"name": "n", "kind": "neg", "inputs": ["x"], "outputs": ["y"]}],
    }
    g = graph_from_json(doc)
    assert g.name == "graph" and g.outputs == ("y",) and g.op("n").role == "forward"
