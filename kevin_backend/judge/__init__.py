"""The judge: static rules, builds, sandboxed correctness and timing, scores and feedback."""
