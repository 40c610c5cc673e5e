"""Device meshes and the logical-axis rules table (see rules.py)."""

from agentjax.parallel.mesh import (MESH_AXES, MeshError, make_mesh, mesh_shape, split_meshes,
                                    use_mesh)
from agentjax.parallel.rules import (LOGICAL_AXIS_RULES, constrain, current_rules,
                                     logical_to_sharding, logical_to_spec)

__all__ = [
    "MESH_AXES", "MeshError", "make_mesh", "mesh_shape", "split_meshes", "use_mesh", "LOGICAL_AXIS_RULES",
    "constrain", "current_rules", "logical_to_sharding", "logical_to_spec",
]
