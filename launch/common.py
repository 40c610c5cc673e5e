"""What the launch scripts share: the multi-host flags and jax.distributed start-up."""

from __future__ import annotations

from absl import flags

_DISTRIBUTED = flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() "
                                 "(auto-detected on TPU pods and SLURM/GPU clusters).")
_COORDINATOR = flags.DEFINE_string("coordinator", None, "host:port of process 0 (implies "
                                   "--distributed).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process' index.")


def init_distributed() -> None:
  """Starts jax.distributed when asked; call before anything touches a device."""
  import jax
  if _DISTRIBUTED.value or _COORDINATOR.value:
    # Only CPU collectives read this; it must be set before the backends start.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
