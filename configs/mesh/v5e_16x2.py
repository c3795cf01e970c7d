"""Two TPU v5e-16 slices (multi-slice): FSDP inside each slice, data parallel across the two over DCN."""
import ml_collections


def get_mesh() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.shape = (1, 16, 1)  # (data, fsdp, tensor) inside one slice
  c.dcn_shape = (2, 1, 1)  # slices along (data, fsdp, tensor)
  c.num_devices = 32  # chips in the whole mesh (the planner uses it when no devices are attached)
  c.num_hosts = 8  # VMs (JAX processes)
  c.accelerator = "v5litepod-16"  # gcloud --accelerator-type (launch/)
  c.device_memory_bytes = 16 * 10**9  # HBM per chip (0 = unknown)
  return c
