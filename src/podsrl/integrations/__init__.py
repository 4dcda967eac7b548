"""PODS inside other training libraries: ``podsrl.integrations.trl`` (TRL's GRPOTrainer) and
``podsrl.integrations.verl`` (verl's v1 trainer)."""

import importlib
from types import ModuleType

from packaging.version import InvalidVersion, Version

from podsrl.errors import install_hint


def supported_range(package: str, supported: tuple[Version, Version]) -> str:
    """``package>=low,<high``: the versions an integration is tested with."""
    return f"{package}>={supported[0]},<{supported[1]}"


def refuse_unsupported(module: str, package: str, version: str, supported: tuple[Version, Version]) -> None:
    """Raise ``ImportError`` where ``version`` of ``package`` is outside ``supported`` ([low, high),
    the versions ``module`` was tested with) or is no version at all, saying how to install a
    supported one."""
    low, high = supported
    try:
        ok = low <= Version(version) < high
    except InvalidVersion:
        ok = False
    if not ok:
        raise ImportError(f"{module} supports {supported_range(package, supported)} (the versions it is tested with); "
                          f"found {package} {version}. Install a supported one: {install_hint(package)}")


def import_required(module: str, package: str, supported: tuple[Version, Version], display: str) -> ModuleType:
    """Import ``package`` for the integration ``module``; where it is missing, an ``ImportError``
    saying which versions to install and how. ``display`` is how the package is written in prose
    (``TRL``). The caller checks the version it finds (:func:`refuse_unsupported`)."""
    try:
        return importlib.import_module(package)
    except ModuleNotFoundError as e:
        if e.name != package:  # the package is there but one of its own imports failed: that error says more
            raise
        raise ImportError(f"{module} needs {display} ({supported_range(package, supported)}): {install_hint(package)}") from None
