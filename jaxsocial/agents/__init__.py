"""The agents' interface: the prompt they read, the actions they may answer, and how answers
are parsed."""
