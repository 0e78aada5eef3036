"""jaxsocial.models."""
