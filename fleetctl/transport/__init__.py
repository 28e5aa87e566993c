"""The one door to a host: connect, run a command, run the agent, forward a port."""
