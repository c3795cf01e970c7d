"""One CPU (or one accelerator): no sharding; the default for laptop runs."""
import ml_collections


def get_mesh() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.shape = (1, 1, 1)  # (data, fsdp, tensor) inside one slice
  c.dcn_shape = (1, 1, 1)  # slices along (data, fsdp, tensor)
  c.num_devices = 1  # chips in the whole mesh (the planner uses it when no devices are attached)
  c.num_hosts = 1  # VMs (JAX processes)
  c.accelerator = "cpu"  # gcloud --accelerator-type (launch/)
  c.device_memory_bytes = 0  # HBM per chip (0 = unknown)
  return c
