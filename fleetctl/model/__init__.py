"""The data the phases pass each other: what a host is, what was decided for it, what happened to it."""
