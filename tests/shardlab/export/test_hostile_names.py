"""Exports of a plan whose every name is hostile carry the names only as text (issue 40).

A model named `x\"\"\"and __import__("os").system("id")or\"\"\"` once exported a DTensor module
whose docstring ended at the name, so importing the module ran `id`. Here the model, every
value, parameter, op and scope and the annotation globs of the strategy carry such text (a
cluster's name reaches no export), and each export must be the benign twin's file with only
the text changed:

- the DTensor module parses, and its syntax tree equals the twin's once string constants
  are blanked: the only code is the module's own (no call it did not write);
- the torchtitan TOML (before 0.3) parses to the twin's keys and values, the names read
  back exactly;
- the argument files (torchtitan 0.3, Megatron-LM) hold the twin's options word for word
  (their values are the frameworks' vocabulary: degrees, sizes, torchtitan's module names);
  the names are only in `#` comment lines, which no name can break;
- the placements JSON names every hostile parameter as it is.

`shardlab.export.literals` is tested on what the service refuses at its door but the engine
could still be handed: line breaks, Unicode line separators, lone surrogates, backslashes.
"""

from __future__ import annotations

import ast
import json
import tomllib
from typing import Any

import pytest

from shardlab.errors import ShardlabError
from shardlab.export.literals import comment_text, doc_text, py_str, sh_arg, toml_str
from shardlab.export.plan_export import export_plan
from shardlab.graph_json import graph_from_json, graph_to_json
from shardlab.ir import ValueKind
from shardlab.models import build_model
from shardlab.plan import Plan, build_plan
from shardlab.strategy import Strategy

TINY = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256,
        "seq": 16, "batch": 8}  # fmt: skip
#: the model name of the finding, and a prefix of every value, op and scope name
MODEL = 'x"""and __import__("os").system("id")or"""'
PREFIX = "p'''+__import__('os').system('id')+'''\"\"\"+exec(\"id\")+\"\"\"\\"


def _document(prefix: str, model: str) -> dict[str, Any]:
    """Tiny Llama's graph document with every value, op and scope under `prefix`."""

    def named(name: str) -> str:
        return f"{prefix}.{name}" if prefix else name

    doc: dict[str, Any] = json.loads(json.dumps(graph_to_json(build_model("llama3-8b", TINY))))
    doc["name"] = model
    for value in doc["values"]:
        value["name"] = named(value["name"])
    for op in doc["ops"]:
        op["name"] = named(op["name"])
        op["inputs"] = [named(n) for n in op["inputs"]]
        op["outputs"] = [named(n) for n in op["outputs"]]
        if op.get("scope"):
            op["scope"] = named(op["scope"])
    doc["outputs"] = [named(n) for n in doc["outputs"]]
    return doc


def _tensor_parallel_placements() -> dict[str, str]:
    """Every parameter's placement on the `tp` axis under megatron_tp (benign names)."""
    strategy = Strategy.build("tp=2", ["megatron_tp"], [], {})
    plan = build_plan(build_model("llama3-8b", TINY), strategy, passes=False)
    params = plan.model.values_of_kind(ValueKind.PARAM)
    return {v.name: f"tp:{plan.completed.specs[v.name].placements[0]}" for v in params}


def _plan(prefix: str, model: str, template: str) -> Plan:
    """The tiny model under `prefix` on dp=2 x tp=2: `template` on dp, and every parameter
    annotated on tp as Megatron places it (the globs are the hostile names themselves)."""
    annotations = [f"{prefix}.{name}={spec}" if prefix else f"{name}={spec}"
                   for name, spec in _tensor_parallel_placements().items()]  # fmt: skip
    strategy = Strategy.build("dp=2,tp=2", [template], annotations, {"recompute": "full"})
    return build_plan(graph_from_json(_document(prefix, model)), strategy, passes=False)


@pytest.fixture(scope="module", params=["dp", "fsdp"])
def twins(request: pytest.FixtureRequest) -> tuple[Plan, Plan]:
    """The benign plan and its hostile twin: data parallel or FSDP, with tensor parallelism."""
    return _plan("", "tiny", request.param), _plan(PREFIX, MODEL, request.param)


def _blanked(tree: ast.AST) -> str:
    """The syntax tree with every string constant emptied: the module's code alone."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def test_the_dtensor_module_runs_no_code_of_the_names(twins: tuple[Plan, Plan]) -> None:
    benign, hostile = (export_plan(p, "dtensor").text for p in twins)
    tree = ast.parse(hostile)
    assert _blanked(tree) == _blanked(ast.parse(benign))
    names = {n.id for n in ast.walk(ast.parse(hostile)) if isinstance(n, ast.Name)}
    assert not names & {"__import__", "exec", "eval", "os", "system"}, names
    doc = ast.get_docstring(ast.parse(hostile), clean=False)
    assert doc is not None and doc.startswith(f"DTensor parallelization of {MODEL!r}")
    assert f"{PREFIX}.layers.0.attn.q_proj.weight" in doc  # the annotation, as text
    constants = {n.value for n in ast.walk(ast.parse(hostile)) if isinstance(n, ast.Constant)}
    assert f"{PREFIX}.layers.0.attn.q_proj.weight" in constants  # PLACEMENTS' key, exactly


def test_the_torchtitan_config_holds_the_names_as_strings(twins: tuple[Plan, Plan]) -> None:
    benign, hostile = (tomllib.loads(export_plan(p, "torchtitan-toml").text) for p in twins)
    parts = hostile["parallelism"].pop("module_fqns_per_model_part", None)
    expected = benign["parallelism"].pop("module_fqns_per_model_part", None)
    assert hostile == benign
    if expected is not None:
        assert parts == [[f"{PREFIX}.{m}" for m in part] for part in expected]
    text = export_plan(twins[1], "torchtitan-toml").text
    code = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert all(line.startswith("[") or " = " in line for line in code), code


@pytest.mark.parametrize("fmt", ["torchtitan", "megatron"])
def test_the_argument_files_hold_the_twins_options(twins: tuple[Plan, Plan], fmt: str) -> None:
    import shlex

    if fmt == "megatron" and any(t.name == "fsdp" for t in twins[0].strategy.templates):
        for plan in twins:  # Megatron-LM has no FSDP: refused for both twins
            with pytest.raises(ShardlabError, match="is FSDP"):
                export_plan(plan, fmt)
        return
    benign, hostile = (export_plan(p, fmt).text.splitlines() for p in twins)
    options = [line for line in hostile if not line.startswith("#")]
    assert options == [line for line in benign if not line.startswith("#")]
    assert all(line.startswith(("--", "activation-checkpoint:")) for line in options), options
    assert len(hostile) == len(benign)  # no name adds a line
    assert all(shlex.split(line) for line in options)
    comments = "\n".join(line for line in hostile if line.startswith("#"))
    assert comment_text(PREFIX) in comments  # the annotations, as text


def test_the_placements_json_names_every_parameter_as_it_is(twins: tuple[Plan, Plan]) -> None:
    benign, hostile = (json.loads(export_plan(p, "json").text) for p in twins)
    assert hostile["model"] == MODEL
    names = [entry["name"] for entry in hostile["parameters"]]
    assert names == [f"{PREFIX}.{entry['name']}" for entry in benign["parameters"]]
    assert [e["placements"] for e in hostile["parameters"]] == [
        e["placements"] for e in benign["parameters"]
    ]


TEXTS = [
    'a"""b', "a'''b", "ends in a backslash\\", "line\nbreak", "carriage\rreturn",
    "separator\u2028here", "paragraph\u2029too", "next line\x85", "form\x0cfeed", "nul\x00",
    "tab\there", 'mixed \\"""\n"""\\', "lone \ud800 surrogate", "snowman \u2603 ok",
]  # fmt: skip


@pytest.mark.parametrize("text", TEXTS)
def test_literals_keep_every_text_inside_its_place(text: str) -> None:
    assert ast.literal_eval(py_str(text)) == text
    module = f'"""{doc_text(text)}"""\nx = 1  # {comment_text(text)}\n'
    tree = ast.parse(module)
    assert ast.get_docstring(tree, clean=False) == text
    assert [type(s).__name__ for s in tree.body] == ["Expr", "Assign"]
    assert len(comment_text(text).splitlines()) <= 1 and "\n" not in comment_text(text)
    toml = f"# {comment_text(text)}\nkey = {toml_str(text)}\n"
    clean = text.replace("\ud800", "\ufffd")
    assert tomllib.loads(toml) == {"key": clean}
    import shlex

    if all(c.isprintable() for c in text):
        assert shlex.split(sh_arg(text)) == [text]
    else:  # an argument file keeps one option a line: no line break inside a word
        with pytest.raises(ShardlabError, match="cannot hold on one line"):
            sh_arg(text)
