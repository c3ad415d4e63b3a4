"""Every prompt method by its `prompt.method` name (`pipeline.params.MethodName`)."""

from __future__ import annotations

from pipeline.methods import dualprompt, l2p, msp, pal, rebq
from pipeline.methods import map as map_method
from pipeline.model.method import Method

METHODS: dict[str, type[Method]] = {
    "pal": pal.METHOD,
    "map": map_method.METHOD,
    "msp": msp.METHOD,
    "rebq": rebq.METHOD,
    "l2p": l2p.METHOD,
    "dualprompt": dualprompt.METHOD,
}
