"""The eager `tpu` device: `import torchtpu.device`, then tensors and modules on device="tpu".

    import torch, torchtpu.device
    x = torch.randn(2, 2, device="tpu")
    model = model.to("tpu")

Importing this package registers the device with torch (PrivateUse1, renamed "tpu"; once per
process) and loads no JAX: the runtime starts with the first transfer or program. See
docs/device.md.
"""
from torchtpu.device.registration import register

register()

__all__ = ["register"]
