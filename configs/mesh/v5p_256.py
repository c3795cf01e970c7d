"""TPU v5p-256: 128 chips on 32 hosts, 95 GB HBM per chip. FSDP 32 x tensor 4: splitting heads and MLP
features 4 ways keeps each FSDP all-gather a quarter of the size."""
import ml_collections


def get_mesh() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.shape = (1, 32, 4)  # (data, fsdp, tensor) inside one slice
  c.dcn_shape = (1, 1, 1)  # slices along (data, fsdp, tensor)
  c.num_devices = 128  # chips in the whole mesh (the planner uses it when no devices are attached)
  c.num_hosts = 32  # VMs (JAX processes)
  c.accelerator = "v5p-256"  # gcloud --accelerator-type (launch/)
  c.device_memory_bytes = 95 * 10**9  # HBM per chip (0 = unknown)
  return c
