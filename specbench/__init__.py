"""specbench: compare speculative-decoding strategies (drafter x acceptance rule x tree shape)."""

__version__ = "0.1.0"
