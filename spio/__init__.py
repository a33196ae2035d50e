"""spio: fast CUDA kernels for training convolutional networks with PyTorch.

Importing spio does no GPU or NVRTC work and does not import torch: the driver, NVRTC, the compile
pool and the PyTorch-facing modules load on first use.

    import spio
    model = spio.transform(model)          # eligible nn.Conv2d layers now run spio kernels
    layers = spio.scan_modules(model, x)   # the Conv2dGw8Params met in one forward pass
    spio.precompile(model, x)              # build its kernels now, in parallel
"""

import importlib
from typing import TYPE_CHECKING

from .log import logger

if TYPE_CHECKING:  # the names __getattr__ loads, as type checkers should see them
    from . import functional as functional
    from . import generators as generators
    from . import kernels as kernels
    from . import layers as layers
    from .transform import _CallablePackage
    from .transform import precompile as precompile
    from .transform import scan_modules as scan_modules
    from .transform import untransform as untransform

    transform: _CallablePackage  # the package, callable as its transform function

__version__ = "0.4.0.dev0"

#: GPU architectures spio's kernels are built and tested for.
supported_arch = ("sm_80", "sm_86", "sm_89", "sm_90")

#: Architectures NVRTC may target but spio does not test yet.
experimental_arch = ("sm_100", "sm_120")

# Public names loaded on first access (they import torch).
_LAZY = {
    "transform": "spio.transform",
    "untransform": "spio.transform",
    "scan_modules": "spio.transform",
    "precompile": "spio.transform",
}

# Public subpackages, also loaded on first access: spio.layers.Conv2dGw8 works after `import spio`.
_SUBPACKAGES = ("functional", "generators", "kernels", "layers")

__all__ = ["__version__", "experimental_arch", "logger", "supported_arch", *_LAZY]


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        return importlib.import_module(f"spio.{name}")
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        # spio.transform is a callable package: importing it already bound the name here.
        return module if name == "transform" else getattr(module, name)
    raise AttributeError(f"module 'spio' has no attribute {name!r}")
