"""jaxsocial.envs."""
