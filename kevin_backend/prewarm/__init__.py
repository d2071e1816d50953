"""Prewarming: fill the kernel cache offline, on every local GPU or a Ray cluster."""
