"""The arguments of a frozen options dataclass, checked before its generated ``__init__``.

A dataclass's ``__init__`` answers an unknown keyword or one positional too many with a bare
``TypeError``; idemkey's options answer every mistake with a :class:`ConfigurationError` that
names the constructor and its options (``Policy`` does the same through its own fields).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping

from .errors import ConfigurationError

__all__ = ["check_arguments"]


def check_arguments(cls: type, args: tuple[object, ...], options: Mapping[str, object]) -> None:
    """Raise :class:`ConfigurationError` unless ``cls(*args, **options)`` names only its
    init fields, each once."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    where = cls.__name__
    if len(args) > len(names):
        raise ConfigurationError(
            f"{where} takes at most {len(names)} positional arguments "
            f"({', '.join(names)}), got {len(args)}"
        )
    for name in options:
        if name not in names:
            near = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {near[0]}=?" if near else f"the options are {', '.join(names)}"
            raise ConfigurationError(f"{where}({name}=...): not an option; {hint}")
        if names.index(name) < len(args):
            raise ConfigurationError(f"{where}: {name} given twice, by position and by name")
