"""SGLang inside containers: a host whose SGLang runs in a container (docker, podman, a Kubernetes pod).

The inventory names the runtime and the container (`container:` on a host, config/inventory.py); the
agent then runs inside it over the host's SSH session, through the runtime's exec with stdin and no
tty (config/containers.py `exec_prefix`, applied as one layer of the remote command: transport/layers.py). What the
runtime says about the container (its id, image, start time, read-only root, mounts) is read on the
host, outside the container (inspect.py), so facts can say which image it came from, deploy can
refuse a read-only root and warn when the state dir would die with the container, and status and
verify-logs can say when the container was re-created since the deploy (the deploy records its id:
ops/container_advice.py). host.py inspects a host's container through a transport; mainproc.py
restarts and reads a server that is the container's main process. The Dockerfile route is
plan/dockerfile.py.
"""
