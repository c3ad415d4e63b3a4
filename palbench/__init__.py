"""The GPU acceptance tool: `python -m palbench.gpu_check` measures a card
(the image path, each method's steady step, a rehearsal of PAL, several
cells on one card) and writes its report and the card file `pal-paper plan`
prices with (bench/README.md, "The GPU call").

Its parts run as modules, `python -m palbench.<part>`: `pace` (a method's
steady step), `image_path` (photos to features), `extract` (the prompted
forward's throughput), `rehearsal` (one run of PAL on a Food101-shaped
tree), `float_paths` (how far a change of float path moves the outputs).
Where a part measures an older tree, that tree comes first on PYTHONPATH and
this package after it.
"""
