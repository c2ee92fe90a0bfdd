"""Where hftoolkit steps into a library's own code: one module per patched library and version range, named after
both (`accelerate_1_15` patches accelerate 1.15). Each module says what it changes and why in its docstring, and
states the range it was checked against in `VERSIONS`; tests/unit/patches/test_patches.py fails when the installed
library leaves that range, or when the code a patch relies on has changed, so that a new release is checked, not
assumed.
"""

from __future__ import annotations

import importlib
import pkgutil


def patch_modules() -> list:
    """Every patch module of this folder."""
    return [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)]


def installed(module) -> bool:
    """Whether `module.LIBRARY` is installed: a patch of an optional library that is absent (TRL, DeepSpeed: an extra
    of pyproject) is not applied, nor needed, and its check has nothing to read."""
    import importlib.util

    return importlib.util.find_spec(module.LIBRARY.replace("-", "_")) is not None


def in_range(module) -> bool:
    """The installed version of `module.LIBRARY` is within `module.VERSIONS`."""
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return Version(version(module.LIBRARY)) in SpecifierSet(module.VERSIONS)
