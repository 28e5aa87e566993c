"""What a person sees: safe text and tables (the only home that imports rich), host names grouped,
the --json envelope, suggested commands finished with the command's own inputs."""
