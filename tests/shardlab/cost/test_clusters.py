"""Clusters as data: presets load with their datasheet figures, files round-trip, and every
bad name or file is a ClusterError that names the offending field and value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shardlab.cost.clusters import (
    Cluster,
    Link,
    cluster_from_dict,
    load_cluster,
    preset_names,
)
from shardlab.errors import ClusterError


def user_cluster() -> dict[str, Any]:
    return {
        "name": "lab-4x4",
        "nodes": 4,
        "devices_per_node": 4,
        "peak_flops": {"bfloat16": 2e14, "float32": 2e13},
        "hbm_bytes": 48e9,
        "hbm_bandwidth": 1e12,
        "intra_node": {"bandwidth": 100e9, "latency": 4e-6},
        "inter_node": {"bandwidth": 10e9, "latency": 1e-5},
        "overlap_slowdown": 0.05,
        "launch_overhead": 6e-6,
        "matmul_efficiency": 0.7,
        "memory_efficiency": 0.85,
    }


def write(tmp_path: Path, data: Any, name: str = "cluster.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data, indent=2))
    return path


def error_of(data: dict[str, Any]) -> ClusterError:
    with pytest.raises(ClusterError) as info:
        cluster_from_dict(data)
    return info.value


def test_preset_names_are_the_documented_ones() -> None:
    assert preset_names() == [
        "h100-sxm-8x8",
        "h100-sxm-1x8",
        "h100-sxm-64x8",
        "h200-8x8",
        "a100-80g-8x8",
        "cpu-local",
    ]


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_loads_and_round_trips(name: str) -> None:
    cluster = load_cluster(name)
    assert cluster.name == name
    assert cluster.world_size == cluster.nodes * cluster.devices_per_node
    assert cluster.source and cluster.description
    assert Cluster.from_json(cluster.to_json()) == cluster
    assert cluster_from_dict(json.loads(json.dumps(cluster.to_json()))) == cluster
    assert hash(cluster) == hash(load_cluster(name))


def test_h100_sxm_8x8_shape_and_figures() -> None:
    c = load_cluster("h100-sxm-8x8")
    assert (c.nodes, c.devices_per_node, c.world_size) == (8, 8, 64)
    assert [c.node_of(d) for d in (0, 7, 8, 63)] == [0, 0, 1, 7]
    assert c.peak_flops == {
        "bfloat16": 989e12,
        "float16": 989e12,
        "tfloat32": 494e12,
        "float32": 67e12,
        "float64": 67e12,
    }
    assert (c.hbm_bytes, c.hbm_bandwidth) == (80e9, 3.35e12)
    assert c.intra_node == Link(360e9, 3e-6)
    assert c.inter_node == Link(40e9, 6e-6)


def test_family_presets_differ_where_the_hardware_does() -> None:
    h100, h200, a100 = (load_cluster(n) for n in ("h100-sxm-8x8", "h200-8x8", "a100-80g-8x8"))
    assert h200.peak_flops == h100.peak_flops
    assert (h200.hbm_bytes, h200.hbm_bandwidth) == (141e9, 4.8e12)
    assert a100.peak_flops["bfloat16"] == 312e12
    assert a100.peak_flops["float32"] == a100.peak_flops["float64"] == 19.5e12
    assert a100.peak_flops["tfloat32"] == 156e12
    assert (a100.hbm_bytes, a100.hbm_bandwidth) == (80e9, 2.039e12)
    cpu = load_cluster("cpu-local")
    assert (cpu.nodes, cpu.devices_per_node) == (1, 2)
    assert cpu.intra_node == Link(2e9, 3e-5)


@pytest.mark.parametrize(
    ("name", "nodes", "per_node"),
    [("h100-sxm-1x8", 1, 8), ("h100-sxm-64x8", 64, 8), ("h200-2x4", 2, 4), ("a100-80g-3x8", 3, 8)],
)
def test_any_family_shape_parses(name: str, nodes: int, per_node: int) -> None:
    c = load_cluster(name)
    assert (c.name, c.nodes, c.devices_per_node) == (name, nodes, per_node)
    assert c.node_of(c.world_size - 1) == nodes - 1


@pytest.mark.parametrize("name", ["tpu-v5", "h100", "h100-sxm", "h100-sxm-8", "h100-sxm-8x8x8"])
def test_unknown_preset_lists_the_known_ones(name: str) -> None:
    with pytest.raises(ClusterError) as info:
        load_cluster(name)
    assert repr(name) in info.value.message
    assert all(known in info.value.message for known in preset_names())
    assert info.value.detail["known"] == preset_names()


@pytest.mark.parametrize("name", ["h100-sxm-0x8", "h100-sxm-2x16", "a100-80g-1x0"])
def test_impossible_shapes_are_rejected(name: str) -> None:
    with pytest.raises(ClusterError, match="devices per node"):
        load_cluster(name)


def test_device_outside_the_cluster_is_an_error() -> None:
    with pytest.raises(ClusterError, match="device 64 is outside cluster 'h100-sxm-8x8'"):
        load_cluster("h100-sxm-8x8").node_of(64)


def test_user_file_loads(tmp_path: Path) -> None:
    path = write(tmp_path, user_cluster())
    c = load_cluster(str(path))
    assert load_cluster(path) == c
    assert (c.name, c.world_size, c.node_of(5)) == ("lab-4x4", 16, 1)
    assert (c.description, c.source) == ("", "")
    assert c.inter_node == Link(10e9, 1e-5)
    assert load_cluster(str(write(tmp_path, c.to_json(), "again.json"))) == c


def test_missing_field_is_named(tmp_path: Path) -> None:
    data = user_cluster()
    del data["hbm_bandwidth"]
    with pytest.raises(ClusterError) as info:
        load_cluster(str(write(tmp_path, data)))
    assert "field 'hbm_bandwidth' is missing" in info.value.message
    assert "cluster.json" in info.value.message
    assert info.value.detail["field"] == "hbm_bandwidth"
    del data["name"]
    assert "field 'name' is missing" in error_of(data).message


def test_missing_link_field_is_named() -> None:
    data = user_cluster()
    del data["inter_node"]["latency"]
    assert "field 'inter_node.latency' is missing" in error_of(data).message


def test_negative_bandwidth_is_named(tmp_path: Path) -> None:
    data = user_cluster()
    data["intra_node"]["bandwidth"] = -3
    with pytest.raises(ClusterError) as info:
        load_cluster(str(write(tmp_path, data)))
    assert (
        "cluster 'lab-4x4': field 'intra_node.bandwidth' must be a positive number, got -3"
        in info.value.message
    )
    assert info.value.detail["field"] == "intra_node.bandwidth"


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("nodes", 0, "field 'nodes' must be a positive integer, got 0"),
        ("devices_per_node", 2.5, "field 'devices_per_node' must be a positive integer, got 2.5"),
        ("nodes", True, "field 'nodes' must be a positive integer, got True"),
        ("hbm_bytes", "80GB", "field 'hbm_bytes' must be a positive number, got '80GB'"),
        ("hbm_bandwidth", 0, "field 'hbm_bandwidth' must be a positive number, got 0"),
        ("launch_overhead", -1e-6, "field 'launch_overhead' must be a non-negative number"),
        ("matmul_efficiency", 1.5, "field 'matmul_efficiency' must be a fraction in (0, 1]"),
        ("peak_flops", {}, "field 'peak_flops' must be a non-empty object"),
        ("intra_node", 5, "field 'intra_node' must be an object"),
        ("name", "", "field 'name' must be a non-empty string"),
    ],
)
def test_bad_values_are_named(path: str, value: object, expected: str) -> None:
    data = user_cluster()
    data[path] = value
    assert expected in error_of(data).message


def test_non_finite_number_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(user_cluster()).replace("1000000000000.0", "NaN"))
    with pytest.raises(
        ClusterError, match="field 'hbm_bandwidth' must be a positive number, got nan"
    ):
        load_cluster(str(path))
    data = user_cluster()
    data["peak_flops"]["float32"] = float("inf")
    assert "field 'peak_flops.float32' must be a positive number, got inf" in error_of(data).message


def test_unknown_key_is_named() -> None:
    data = user_cluster()
    data["nvlink_gbps"] = 900
    err = error_of(data)
    assert "unknown field 'nvlink_gbps'" in err.message
    assert err.detail["field"] == "nvlink_gbps"
    data = user_cluster()
    data["inter_node"]["hops"] = 2
    assert "unknown field 'inter_node.hops'" in error_of(data).message


def test_unknown_dtype_is_named() -> None:
    data = user_cluster()
    data["peak_flops"]["fp32"] = 1e13
    err = error_of(data)
    assert "unknown dtype 'fp32'" in err.message
    assert "bfloat16" in err.message
    assert err.detail["field"] == "peak_flops.fp32"


def test_bad_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{\n  "name": "x",\n  "nodes": 2,,\n}\n')
    with pytest.raises(ClusterError) as info:
        load_cluster(str(path))
    assert "is not valid JSON" in info.value.message
    assert "line 3" in info.value.message
    assert info.value.detail["line"] == 3


def test_missing_file_and_non_object(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="not found"):
        load_cluster(str(tmp_path / "nope.json"))
    with pytest.raises(ClusterError, match="must be an object, got list"):
        load_cluster(str(write(tmp_path, [1, 2])))
