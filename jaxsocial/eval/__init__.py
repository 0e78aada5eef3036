"""jaxsocial.eval."""
