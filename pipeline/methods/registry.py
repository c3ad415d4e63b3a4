"""Every prompt method by its `prompt.method` name (`pipeline.params.MethodName`)."""

from __future__ import annotations

from pipeline.methods import Method, msp, pal, rebq
from pipeline.methods import map as map_method

METHODS: dict[str, type[Method]] = {
    "pal": pal.METHOD,
    "map": map_method.METHOD,
    "msp": msp.METHOD,
    "rebq": rebq.METHOD,
}
