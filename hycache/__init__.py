"""hycache: prefix caching for hybrid attention + SSM models under speculative decoding."""

__version__ = "0.1.0"
