"""Analytic-learning solver for PAL: streams feature shards, fits RLS, evaluates.

This package never imports torch or transformers: a machine with only NumPy
(or CuPy), h5py and click can re-solve and re-evaluate from shared features.
"""
