"""Model-level tools: transform(model) swaps in spio layers and untransform(model) swaps them
back; scan_modules lists the layers met; where_faster(model, x) measures which layers spio runs
faster, for transform's `include`; precompile(model, x) builds a model's kernels ahead of its
first step, in parallel.

`spio.transform` names both this package and the function. Importing the package makes the
import system set the attribute spio.transform to the package, hiding a re-exported function,
so the package itself is callable: spio.transform(model) works either way.
"""

import sys
import types
from typing import TYPE_CHECKING

from .modules import precompile, scan_modules, transform, untransform, where_faster

__all__ = ["precompile", "scan_modules", "transform", "untransform", "where_faster"]


class _CallablePackage(types.ModuleType):
    if TYPE_CHECKING:
        # What type checkers see as spio.transform (spio/__init__.py declares it so): called,
        # transform's signature; its functions as attributes, not a module type's Any.
        __call__ = staticmethod(transform)
        transform = staticmethod(transform)
        untransform = staticmethod(untransform)
        scan_modules = staticmethod(scan_modules)
        precompile = staticmethod(precompile)
        where_faster = staticmethod(where_faster)
    else:

        def __call__(self, *args, **kwargs):
            """Same as spio.transform.transform(*args, **kwargs)."""
            return transform(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
