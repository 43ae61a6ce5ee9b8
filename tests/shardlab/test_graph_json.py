"""The JSON form: exact round trips for every preset and agreement with the schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

from shardlab.errors import GraphError
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


@pytest.mark.parametrize(
    ("where", "value", "field"),
    [
        (("ops", 0, "name"), "y\x00", "ops.0.name"),
        (("values", 1, "name"), "w\x7f0", "values.1.name"),
        (("name",), "line\nbreak", "name"),
        (("meta",), {"key\x01": 1}, "meta"),
    ],
)
def test_control_characters_are_refused_naming_where(
    where: tuple[str | int, ...], value: object, field: str
) -> None:
    doc = graph_to_json(_small("mlp_demo"))
    holder = doc
    for part in where[:-1]:
        holder = holder[part]
    holder[where[-1]] = value
    with pytest.raises(GraphError, match="control character U\\+00") as err:
        graph_from_json(doc)
    assert err.value.message.startswith(f"the graph document at {field}: ")
    assert err.value.detail == {"field": field}


def test_dims_past_the_limit_are_refused_by_the_schema_too() -> None:
    doc = graph_to_json(_small("mlp_demo"))
    doc["values"][0]["shape"] = [2**31, 4]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, graph_schema())
    with pytest.raises(GraphError, match="dim 0 of size 2147483648"):
        graph_from_json(doc)
