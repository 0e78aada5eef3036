"""jaxsocial.train."""
