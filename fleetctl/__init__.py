"""fleetctl: roll SGLang patches across GPU fleets over SSH and prove what runs."""

__version__ = "0.1.0"
