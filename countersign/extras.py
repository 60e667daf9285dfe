"""How to install one of Countersign's optional extras, said the same way wherever one is missing.

Countersign ships as the wheel built from this repository, distribution `countersign-approvals`
(the import package is `countersign`); the name `countersign` on PyPI belongs to an unrelated
project, so `pip install 'countersign[extra]'` would fetch that one instead.
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "countersign-approvals"
_WHEEL = DISTRIBUTION.replace("-", "_")


def install_hint(extra: str) -> str:
    """The line that says how to add `extra` to this installation."""
    try:
        wheel = f"{_WHEEL}-{metadata.version(DISTRIBUTION)}-py3-none-any.whl"
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        wheel = f"{_WHEEL}-<version>-py3-none-any.whl"
    return (
        f"install Countersign's {extra} extra: pip install -c requirements.lock '{wheel}[{extra}]' (the built wheel), "
        f"or pip install -e '.[{extra}]' in a checkout (the `countersign` on PyPI is another project)"
    )
