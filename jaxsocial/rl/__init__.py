"""jaxsocial.rl."""
