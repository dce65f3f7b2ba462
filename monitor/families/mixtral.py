"""Mixtral as a family of its own (filled in by the Mixtral work)."""


def register() -> None:
    """Register Mixtral with transformers' AutoConfig and petals 2.2's model registry."""
