"""The offline demo: a synthetic image–text dataset and a tiny pre-trained ViLT.

`stage` is the `pal demo` stage (writes `data/demo/`), `data` designs the
classes and renders images and captions, `model` builds and pre-trains the
backbone.
"""
