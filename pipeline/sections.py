"""Every section a params file may hold, and the class that loads each: the
one registry of params sections (`pal check`, tests/test_dvc_deps.py).

The pipeline's own sections are `pipeline.params.SECTIONS` (what its stages
load); `solve`/`evaluate` belong to the solver, `protocol` to palcore.
`ablation` and `pipelines` are tables of variants, loaded by
`palcore.variants` (`variant_row`, `pipeline_variants`), not by one class. No
stage imports this module: it imports every package's params.
"""

from __future__ import annotations

from palcore.params import ProtocolParams
from pipeline.params import SECTIONS
from solver.api import EvaluateParams, SolveParams

# section name → its frozen dataclass
PARAM_CLASSES: dict[str, type] = {
    **SECTIONS,
    "solve": SolveParams,
    "evaluate": EvaluateParams,
    "protocol": ProtocolParams,
}
# every top-level key a params file may hold
KNOWN_SECTIONS = (*PARAM_CLASSES, "ablation", "pipelines")
