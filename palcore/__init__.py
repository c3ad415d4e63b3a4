"""The plumbing every stage shares, and nothing else: errors (`errors`),
params loading with the protocol's runs and PAL's variants (`params`), the CLI
helpers (`cliutil`), output names and atomic writes (`outputs`) and the
missing-modality codes (`codes`).

Every stage's dvc.yaml deps name this folder, so a change here reruns the
whole pipeline: it changes rarely and deliberately (DESIGN §9). It imports
neither torch nor the solver.
"""
