"""`runtime.torch_device`: where a torch rank keeps its blocks, and in which precision."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from shardlab.cli import app
from shardlab.errors import ExecutionError
from shardlab.runtime.torch_device import RankDevice, to_device, to_host

torch = pytest.importorskip("torch")


def test_devices_pick_their_collective_library() -> None:
    assert RankDevice().collective_backend == "gloo"
    assert RankDevice("cuda").collective_backend == "nccl"
    with pytest.raises(ExecutionError, match="device 'tpu'"):
        RankDevice("tpu")
    with pytest.raises(ExecutionError, match="precision 'fp8'"):
        RankDevice("cpu", "fp8")


def test_graph_precision_runs_the_declared_dtypes() -> None:
    mixed = RankDevice("cpu", "graph")
    assert mixed.run_dtype("bfloat16") == "bfloat16"
    assert mixed.run_dtype("float32") == "float32"  # masters and moments stay float32
    assert mixed.run_dtype("float64") == "float32"
    assert mixed.run_dtype("int64") is None
    assert RankDevice().run_dtype("bfloat16") is None  # compute precision: as the block arrives


def test_blocks_go_to_the_device_and_back() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    t = to_device(x, torch.device("cpu"), "bfloat16")
    assert t.dtype == torch.bfloat16 and tuple(t.shape) == (2, 3)
    back = to_host(t)
    assert back.dtype == np.float32 and np.allclose(back, x, rtol=2**-8)
    same = to_device(x, torch.device("cpu"))
    assert same.dtype == torch.float32 and np.shares_memory(same.numpy(), x)  # no copy on CPU
    ints = to_device(np.array([1, 2]), torch.device("cpu"), "bfloat16")
    assert ints.dtype == torch.int64  # only floats are cast


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_named() -> None:
    with pytest.raises(ExecutionError, match=r"no CUDA device .* run on device 'cpu'"):
        RankDevice("cuda").check_devices(2)
    args = ["verify", "mlp_demo", "--mesh", "x=2", "--template", "dp", "--backend", "torch"]
    result = CliRunner().invoke(app, [*args, "--device", "cuda"])
    assert result.exit_code == 1 and "no CUDA device" in result.output
    result = CliRunner().invoke(app, [*args[:-2], "--device", "cuda"])
    assert result.exit_code == 1 and "need --backend torch" in result.output
