"""User-facing errors.

Every mistake a user can make (a malformed graph, a placement that does not divide a dim,
an unknown preset) raises a `ShardlabError` subclass. Its message names the offending thing
(op, value, dim, mesh axis, line); `code` and `detail` let the service answer
`{code, message, detail}` with a 4xx status. `assert` is reserved for internal invariants.
"""

from __future__ import annotations

from typing import Any


class ShardlabError(Exception):
    """Base class of every error caused by user input."""

    code: str = "shardlab_error"

    def __init__(self, message: str, **detail: Any) -> None:
        super().__init__(message)
        self.message = message
        self.detail: dict[str, Any] = {k: v for k, v in detail.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        """The `{code, message, detail}` body the API answers with."""
        return {"code": self.code, "message": self.message, "detail": self.detail}


class GraphError(ShardlabError):
    """A graph is malformed: dangling or duplicate names, cycles, bad shapes or kinds."""

    code = "invalid_graph"


class OpSignatureError(ShardlabError):
    """An op's inputs or attributes do not fit its kind (raised by shape inference).

    Raised without the op's name; `validate_graph` re-raises it as a `GraphError` that
    names the op.
    """

    code = "invalid_op"


class MeshError(ShardlabError):
    """A mesh is malformed or an axis name is unknown."""

    code = "invalid_mesh"


class PlacementError(ShardlabError):
    """A placement is malformed or does not fit a tensor on a mesh."""

    code = "invalid_placement"


class PresetError(ShardlabError):
    """An unknown model preset, or an override that does not apply to it."""

    code = "invalid_preset"


class ExecutionError(ShardlabError):
    """A graph cannot be executed: missing input data, an op without an implementation."""

    code = "execution_error"


class ClusterError(ShardlabError):
    """A cluster file or preset name is invalid: unknown preset, missing or bad field."""

    code = "invalid_cluster"


class ModelImportError(ShardlabError):
    """A model cannot be imported: its torch.export fails, or a Hugging Face config names an
    unsupported architecture or lacks a field (the message names the op or the field)."""

    code = "import_error"
