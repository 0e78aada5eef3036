"""jaxsocial.social."""
