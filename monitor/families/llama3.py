"""Llama 3.x as a variant of petals' llama family (filled in by the Llama 3 work)."""


def register() -> None:
    """Make transformers 4.34's Llama accept and compute ``rope_type: llama3`` configs."""
