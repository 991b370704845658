"""The eager `tpu` device: `import torchtpu.device`, then tensors and modules on device="tpu".

    import torch, torchtpu.device
    x = torch.randn(2, 2, device="tpu")
    model = model.to("tpu")

Importing this package registers the device with torch (PrivateUse1, renamed "tpu"; once per
process) and loads no JAX: the kernels register when torch makes the first tpu tensor, the
runtime starts with the first transfer or program. An installed torchtpu does the same at every
`import torch` (torchtpu/autoload.py). See docs/device.md.
"""
from torchtpu.device.registration import register, register_device

register_device()

__all__ = ["register"]
