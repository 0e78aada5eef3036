"""jaxsocial.generation."""
