"""jaxsocial: LLM agents trained on social reward, written as JAX."""

__version__ = "0.1.0"
