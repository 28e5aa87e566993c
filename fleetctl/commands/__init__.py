"""One module per CLI command family. Each exposes `register(app)`."""
