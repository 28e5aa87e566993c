"""Loading and validating the user's YAML files (inventory, playbook)."""
