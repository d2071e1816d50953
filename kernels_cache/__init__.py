"""The seed kernel cache shipped with kevin_backend: one folder per entry, named by the key's digest.

Read-only: consulted after the user cache. See README.md in this folder.
"""
