"""`shardlab import`: a PyTorch module or a Hugging Face config.json -> a graph JSON file.

    shardlab import model.py:build -o model.json
    shardlab import model.py:build --input x=4x16:float32 --input labels=4x16:int64 -o m.json
    shardlab import --hf-config config.json --batch 4 --seq 512 -o llama.json

`build` is called with no arguments under `torch.device("meta")` (so the modules it makes
hold no weights) and returns either `(module, example_inputs)` (a tuple of tensors passed
positionally, or a dict passed by name) or the module alone, with its inputs given as
`--input name=DIMxDIM:dtype` (meta tensors passed by name). The file written is the graph
JSON `shardlab plan model.json ...` reads; the command prints the parameter count and the
ops that fell back to opaque.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from shardlab.cli.common import app, fail
from shardlab.errors import ModelImportError, ShardlabError
from shardlab.graph_json import dumps_graph
from shardlab.ir import DTYPE_BYTES, Graph


@app.command("import")
def import_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the graph JSON.")],
    source: Annotated[
        str | None,
        typer.Argument(help="FILE.py:FUNCTION returning (module, example_inputs) or a module."),
    ] = None,
    hf_config: Annotated[
        Path | None, typer.Option("--hf-config", help="A Hugging Face config.json to import.")
    ] = None,
    inputs: Annotated[
        list[str] | None,
        typer.Option("--input", help="An input of a module returned alone: name=4x16:int64."),
    ] = None,
    batch: Annotated[int, typer.Option(help="Batch size (--hf-config).")] = 1,
    seq: Annotated[
        int | None,
        typer.Option(help="Sequence length (--hf-config; default min(positions, 2048))."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="The graph's name.")] = None,
) -> None:
    """Import a model from PyTorch (torch.export) or a Hugging Face config as a graph file."""
    try:
        if (source is None) == (hf_config is None):
            raise ModelImportError("give exactly one of FILE.py:FUNCTION and --hf-config")
        if hf_config is not None:
            from shardlab.importers.hf_config import graph_from_hf_config

            try:
                config = json.loads(hf_config.read_text())
            except json.JSONDecodeError as exc:
                raise ModelImportError(f"{hf_config} is not JSON: {exc}") from exc
            graph = graph_from_hf_config(config, batch=batch, seq=seq, name=name)
        else:
            assert source is not None
            graph = _import_module(source, inputs or [], name)
    except (OSError, ShardlabError) as exc:
        fail(exc if isinstance(exc, ShardlabError) else ModelImportError(str(exc)))
    output.write_text(dumps_graph(graph, indent=1))
    typer.echo(f"wrote {output} ({len(graph.ops)} ops, {graph.num_params():,} params)")
    for item in graph.meta.get("opaque_ops", []):
        typer.echo(f"opaque: {item['op']} ({item['aten']}: {item['reason']})")
    for note in graph.meta.get("import_notes", []):
        typer.echo(f"note: {note}")


def _import_module(source: str, inputs: Sequence[str], name: str | None) -> Graph:
    import torch

    from shardlab.importers.torch_export import graph_from_module

    path_text, sep, fn_name = source.rpartition(":")
    if not sep or not fn_name or not path_text:
        raise ModelImportError(f"expected FILE.py:FUNCTION, got {source!r}", source=source)
    path = Path(path_text)
    if not path.is_file():
        raise ModelImportError(f"no such file {path_text!r}", source=source)
    spec = importlib.util.spec_from_file_location(f"shardlab_import_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        build = getattr(module, fn_name, None)
        if not callable(build):
            raise ModelImportError(f"{path_text} has no function {fn_name!r}", source=source)
        with torch.device("meta"):
            built = build()
    except ShardlabError:
        raise
    except Exception as exc:  # the user's code: report it, do not crash
        raise ModelImportError(
            f"{source} failed: {type(exc).__name__}: {exc}", source=source
        ) from exc
    finally:
        sys.modules.pop(spec.name, None)
    graph_name = name or path.stem
    if isinstance(built, tuple | list) and len(built) == 2:
        model, example = built
        if isinstance(example, Mapping):
            return graph_from_module(model, (), name=graph_name, example_kwargs=example)
        return graph_from_module(model, tuple(example), name=graph_name)
    if not inputs:
        raise ModelImportError(
            f"{source} returned a module without example inputs; return (module, inputs) or "
            "give --input name=DIMxDIM:dtype",
            source=source,
        )
    kwargs = dict(_meta_input(text, torch) for text in inputs)
    return graph_from_module(built, (), name=graph_name, example_kwargs=kwargs)


def _meta_input(text: str, torch: Any) -> tuple[str, Any]:
    """`x=4x16:float32` -> ("x", a meta tensor of that shape and dtype)."""
    key, eq, rest = text.partition("=")
    shape_text, _, dtype = rest.partition(":")
    dtype = dtype or "float32"
    try:
        shape = [int(d) for d in shape_text.split("x")]
    except ValueError:
        shape = []
    if not eq or not key or not shape or any(d <= 0 for d in shape):
        raise ModelImportError(
            f"--input {text!r}: expected name=DIMxDIM[:dtype], e.g. tokens=4x128:int64",
            input=text,
        )
    if dtype not in DTYPE_BYTES:
        raise ModelImportError(
            f"--input {text!r}: unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}",
            input=text,
        )
    return key, torch.zeros(shape, dtype=getattr(torch, dtype), device="meta")
