"""TPU v5p-64: 32 chips on 8 hosts, 95 GB HBM per chip. FSDP over all chips."""
import ml_collections


def get_mesh() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.shape = (1, 32, 1)  # (data, fsdp, tensor) inside one slice
  c.dcn_shape = (1, 1, 1)  # slices along (data, fsdp, tensor)
  c.num_devices = 32  # chips in the whole mesh (the planner uses it when no devices are attached)
  c.num_hosts = 8  # VMs (JAX processes)
  c.accelerator = "v5p-64"  # gcloud --accelerator-type (launch/)
  c.device_memory_bytes = 95 * 10**9  # HBM per chip (0 = unknown)
  return c
