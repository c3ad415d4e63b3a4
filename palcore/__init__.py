"""The plumbing every stage shares, and nothing else: errors (`errors`),
params loading with the protocol's runs and PAL's variants (`params`), the CLI
helpers (`cliutil`), output names and atomic writes (`outputs`) and the
missing-modality codes (`codes`).

The cheap stages' dvc.yaml deps and the contracts stage's name this folder,
so a change here reruns them and the output contracts' guard, never a GPU
stage whose outputs did not move (DESIGN §2, §9). It imports nothing of the
project's other packages, nor torch.
"""
