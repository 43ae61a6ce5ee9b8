"""The malformed-graph corpus: every file is rejected with a message naming the culprit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shardlab.errors import GraphError
from shardlab.validate import load_graph_file

CORPUS = Path(__file__).parent / "malformed"

#: file -> a pattern its error message must match (it names the op, value or line).
EXPECTED = {
    "dangling_input.json": r"op 'act' reads 'h', which is not a value",
    "dangling_output.json": r"op 'act' writes 'q', which is not a value",
    "duplicate_value.json": r"duplicate value name 'y'",
    "duplicate_op.json": r"duplicate op name 'mm'",
    "cycle.json": r"cycle: (act -> mm -> act|mm -> act -> mm)",
    "zero_dim.json": r"value 'w' has dim 1 of size 0",
    "negative_dim.json": r"value 'x' has dim 0 of size -4",
    "string_dim.json": r"value 'x' has dim 0 = '4'",
    "unknown_dtype.json": r"value 'w' has unknown dtype 'float8'",
    "unknown_value_kind.json": r"value 'w' has unknown kind 'weight'",
    "unknown_op_kind.json": r"op 'act': unknown op kind 'fancy_conv'.*opaque",
    "opaque_without_types.json": r"op 'act' \(opaque\):.*output_types",
    "opaque_types_disagree.json": r"op 'act' \(opaque\): output 'z' is declared float32\[4,16\]",
    "declared_shape_wrong.json": r"op 'mm' \(matmul\): output 'y' is declared float32\[4,12\] but "
    r"shape inference gives float32\[4,16\]",
    "dtype_mismatch.json": r"op 'mm' \(matmul\):.*one dtype",
    "contracted_dim.json": r"op 'mm' \(matmul\): contracted dims disagree",
    "never_produced.json": r"value 'orphan' \(activation\) is never produced",
    "produced_twice.json": r"value 'z' is produced twice: by 'act' and by 'act2'",
    "wrong_format.json": r"unsupported graph format 'shardlab.graph/2'",
    "missing_shape.json": r"value 'y' lacks the field 'shape'",
    "input_written.json": r"op 'act' writes 'x', which is a graph input",
    "bad_attr.json": r"op 'mm' \(matmul\): attribute 'transpose_a' must be true or false",
    "arity.json": r"op 'act' \(relu\): relu takes 1 inputs, got 2",
    "unknown_op_field.json": r"op 'mm' has unknown field 'stride'",
    "unknown_role.json": r"op 'act' has unknown role 'training'",
    "output_not_value.json": r"graph output 'loss' is not a value",
    "reshape_count.json": r"op 'act' \(reshape\):.*\[4, 16\].*\[4, 15\]",
    "bad_syntax.json": r"bad_syntax.json: invalid JSON at line 4",
}


def test_corpus_is_large_and_fully_listed() -> None:
    files = {p.name for p in CORPUS.glob("*.json")}
    assert files == set(EXPECTED)
    assert len(files) >= 15


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_malformed_graph_is_rejected_naming_the_culprit(name: str) -> None:
    with pytest.raises(GraphError) as info:
        load_graph_file(CORPUS / name)
    assert re.search(EXPECTED[name], info.value.message), info.value.message
    assert info.value.to_dict()["code"] == "invalid_graph"


def test_errors_carry_structured_detail() -> None:
    with pytest.raises(GraphError) as info:
        load_graph_file(CORPUS / "contracted_dim.json")
    assert info.value.detail["op"] == "mm"
    with pytest.raises(GraphError) as info:
        load_graph_file(CORPUS / "bad_syntax.json")
    assert info.value.detail == {"line": 4, "column": 35}


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match=r"cannot read .*nope.json"):
        load_graph_file(tmp_path / "nope.json")
