"""kvspec: an executable spec of the KV-cache block lifecycle and the checks that hold engines to it."""

__version__ = "0.1.0"
