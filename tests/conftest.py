"""Shared test set-up: offline, no telemetry, deterministic thread counts."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
