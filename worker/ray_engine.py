"""The Ray engine (`shardlab worker --engine ray`): a device job runs as a Ray task, its ranks
gang-scheduled in a placement group.

For a job that requires `nproc` ranks on a device (`backend/devices.py`) the worker reserves
a placement group of one bundle per rank, `{"CPU": 1}` (gloo on CPU) or `{"CPU": 1, "GPU": 1}`
(CUDA), `STRICT_PACK`: every bundle on one node, all or nothing, so a job never holds part of
what it needs while waiting for the rest. The job's task runs in the first bundle; the
torch backend spawns the other ranks itself on that node, in the resources the group holds
for them. `Worker._supervise` polls the task (`RayRun.poll`) as it polls a local child:
heartbeats, cancellation, the deadline and shutdown stop it (`ray.cancel`, force) and free
the group. A job that waits for its group waits inside its deadline.

Not here (yet): progress messages from inside the task (the job says "running on Ray"),
the team's memory cap (Ray's own memory monitor guards its nodes), and pinning CUDA ranks
to the GPUs of their bundles (the task sees its node's GPUs; the torch backend's ranks
talk over gloo). A worker's devices (`devices()`) are those of the largest alive node of
the cluster (`SHARDLAB_WORKER_DEVICES` overrides them), as a job's ranks share one node, and
it takes CPU jobs of at most that node's CPUs (`Devices.cpu_ranks`: a CPU per rank).
"""

from __future__ import annotations

import contextlib
from typing import Any

from backend.devices import CudaDevice, Devices, Requirement
from worker.child import run_job
from worker.devices import from_env, torch_devices

#: seconds `RayRun.poll` waits for the task at most
POLL_S = 0.05
#: the Ray placement strategy of a job's bundles
STRATEGY = "STRICT_PACK"


def _job_task(kind: str, inputs: dict[str, Any]) -> tuple[str, Any]:
    """The Ray task: run the job (`worker.child.run_job`) in this Ray worker process."""
    return run_job(kind, inputs, lambda fraction, message: None)


def bundles(need: Requirement) -> list[dict[str, float]]:
    """One bundle per rank of `need`."""
    one: dict[str, float] = {"CPU": 1.0} if need.device == "cpu" else {"CPU": 1.0, "GPU": 1.0}
    return [dict(one) for _ in range(need.nproc)]


class RayRun:
    """One job's task on Ray and the placement group it runs in."""

    def __init__(self, ray: Any, group: Any, ref: Any) -> None:
        self.ray, self.group, self.ref = ray, group, ref
        self.started = False
        self.answered = False  # its result came back: nothing left to cancel

    def poll(self, stopping: bool) -> tuple[Any, ...] | None:
        """The task's answer (as `worker.child.run_job` gives it); a progress note once its
        group is placed; None while it runs."""
        ray = self.ray
        if not self.started:
            ready, _ = ray.wait([self.group.ready()], timeout=0)
            if ready:
                self.started = True
                return "progress", 0.05, "running on Ray"
        done, _ = ray.wait([self.ref], timeout=POLL_S)
        if not done:
            return None
        self.answered = True
        try:
            state, data = ray.get(self.ref)
        except Exception as exc:  # the task's worker died, or Ray could not run it
            return "error", {
                "code": "engine_crashed",
                "message": f"the job's Ray task failed before answering: {type(exc).__name__}",
                "detail": {"error": str(exc)[:2000]},
            }
        return str(state), data

    def stop(self) -> None:
        """Cancel the task (if it has not answered) and free its placement group.

        A task whose result is ready is never force-cancelled: its result can be ready
        before Ray has processed the task's reply, and force-killing its worker then makes
        Ray's driver fail a check ("Tried to complete task that was not pending") and abort
        the whole process (seen under load in tests/worker/test_ray_engine.py)."""
        from ray.util.placement_group import remove_placement_group

        if not self.answered:
            with contextlib.suppress(Exception):  # it finished meanwhile
                self.ray.cancel(self.ref, force=True)
        remove_placement_group(self.group)


class RayEngine:
    """Runs device jobs on the Ray cluster at `address` (None: the one this process is
    connected to already, else a new local one)."""

    def __init__(self, address: str | None = None) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.ray: Any = ray
        self.task = ray.remote(_job_task)

    def devices(self) -> Devices:
        """`SHARDLAB_WORKER_DEVICES`, else the largest alive node's CPUs and GPUs (torch as
        this process has it: the cluster runs this environment)."""
        given = from_env()
        if given is not None:
            return given
        alive = self.ray.nodes()
        nodes = [n["Resources"] for n in alive if n.get("Alive")]
        cpus = max((int(r.get("CPU", 0)) for r in nodes), default=1)
        gpus = max((int(r.get("GPU", 0)) for r in nodes), default=0)
        version, _ = torch_devices()
        cuda = tuple(CudaDevice(i, "GPU (Ray)", 0) for i in range(gpus))
        return Devices(max(cpus, 1), cuda, version, cpu_ranks=cpus)

    def start(self, kind: str, inputs: dict[str, Any], need: Requirement) -> RayRun:
        """Reserve the job's bundles and submit its task into the first."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = placement_group(bundles(need), strategy=STRATEGY)
        where = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True
        )
        ref = self.task.options(num_cpus=1, num_gpus=0, scheduling_strategy=where).remote(
            kind, inputs
        )
        return RayRun(self.ray, group, ref)

    def close(self) -> None:
        """Nothing to release: the connection is the process's (tests share one)."""
