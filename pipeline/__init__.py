"""PAL pipeline stages: demo data, prepare, prompt tuning and feature extraction.

Uses torch and transformers; the analytic stages live in the torch-free `solver`.
"""
