"""TPU v5p-8: 4 chips (8 TensorCores) on 1 host, 95 GB HBM per chip. FSDP over all chips."""
import ml_collections


def get_mesh() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.shape = (1, 4, 1)  # (data, fsdp, tensor) inside one slice
  c.dcn_shape = (1, 1, 1)  # slices along (data, fsdp, tensor)
  c.num_devices = 4  # chips in the whole mesh (the planner uses it when no devices are attached)
  c.num_hosts = 1  # VMs (JAX processes)
  c.accelerator = "v5p-8"  # gcloud --accelerator-type (launch/)
  c.device_memory_bytes = 95 * 10**9  # HBM per chip (0 = unknown)
  return c
