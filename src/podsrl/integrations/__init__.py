"""PODS inside other training libraries: ``podsrl.integrations.trl`` (TRL's GRPOTrainer) and
``podsrl.integrations.verl`` (verl's v1 trainer)."""

from packaging.version import InvalidVersion, Version


def supported_range(package: str, supported: tuple[Version, Version]) -> str:
    """``package>=low,<high``: the versions an integration is tested with."""
    return f"{package}>={supported[0]},<{supported[1]}"


def refuse_unsupported(module: str, package: str, version: str, supported: tuple[Version, Version], hint: str) -> None:
    """Raise ``ImportError`` where ``version`` of ``package`` is outside ``supported`` ([low, high),
    the versions ``module`` was tested with) or is no version at all; ``hint`` says how to install
    a supported one."""
    low, high = supported
    try:
        ok = low <= Version(version) < high
    except InvalidVersion:
        ok = False
    if not ok:
        raise ImportError(f"{module} supports {supported_range(package, supported)} (the versions it is tested with); "
                          f"found {package} {version}. Install a supported one: {hint}")
