"""TPU v5e-16 (v5litepod-16): 16 chips on 4 hosts, 16 GB HBM per chip. FSDP over all chips."""
import ml_collections


def get_mesh() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.shape = (1, 16, 1)  # (data, fsdp, tensor) inside one slice
  c.dcn_shape = (1, 1, 1)  # slices along (data, fsdp, tensor)
  c.num_devices = 16  # chips in the whole mesh (the planner uses it when no devices are attached)
  c.num_hosts = 4  # VMs (JAX processes)
  c.accelerator = "v5litepod-16"  # gcloud --accelerator-type (launch/)
  c.device_memory_bytes = 16 * 10**9  # HBM per chip (0 = unknown)
  return c
