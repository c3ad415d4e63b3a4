"""Every prompt method by its `prompt.method` name: the module
`pipeline.methods.<name>` and the `Method` subclass it declares as `METHOD`.

The names are `pipeline.params.method_names()`'s, read from the files without
importing them; a module is imported here when its method is built, so a
draft of one method does not stop the others.
"""

from __future__ import annotations

import importlib
from typing import Any

from palcore.errors import ParamsError
from pipeline.model.method import Method
from pipeline.params import check_method, method_names


def method_class(name: str) -> type[Method]:
    """The class of method `name` (`prompt.method`): its module's `METHOD`."""
    check_method(name)
    module = importlib.import_module(f"{__package__}.{name}")
    cls = getattr(module, "METHOD", None)
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise ParamsError(
            f"pipeline/methods/{name}.py: METHOD is {cls!r}, not a subclass of "
            "pipeline.model.method.Method"
        )
    return cls


def __getattr__(name: str) -> Any:
    """`METHODS`: every method's class by name, in `method_names()`' order
    (imports every method module)."""
    if name == "METHODS":
        return {m: method_class(m) for m in method_names()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
