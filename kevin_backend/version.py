"""The package's version, in a module of its own so that any layer can name it without importing
the package's public surface (`kevin_backend/__init__.py`, the top of the layer order)."""

__version__ = "0.1.0"
