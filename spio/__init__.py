"""spio: fast CUDA kernels for training convolutional networks with PyTorch.

Importing spio does no GPU or NVRTC work: the driver, NVRTC and compile pool start on first use.
"""

from .log import logger

__version__ = "0.4.0.dev0"

#: GPU architectures spio's kernels are built and tested for.
supported_arch = ("sm_80", "sm_86", "sm_89", "sm_90")

#: Architectures NVRTC may target but spio does not test yet.
experimental_arch = ("sm_100", "sm_120")

__all__ = ["__version__", "experimental_arch", "logger", "supported_arch"]
