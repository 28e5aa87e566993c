"""STAND-IN for GPU-only Python packages, for fleetctl's CPU probe virtualenv. NOT the real packages.

The CPU virtualenv that sandbox hosts opt into (fleetctl/sandbox/cpu_venv.py) has real torch (CPU
build) and SGLang's pure-Python requirements, but no GPU kernel packages: they do not install or
import without CUDA. A `.pth` line in that venv imports this module, which appends an import finder
(after every real one: an installed package always wins) that answers the names in STAND_IN_ROOTS
with modules whose every attribute is a tolerant placeholder: usable as a base class, a decorator,
a call, a subscript or an annotation, and never computing anything. `FLEETCTL_GPU_STANDIN` is set
in such modules so an answer can say the stand-in was loaded.

Only import-time shape is provided: SGLang's argument processing and worker selection import these
packages (and sometimes ask them for a version) but run no kernel. Python 3.8 grammar, stdlib only.
"""

import importlib.abc
import importlib.machinery
import os
import sys

STAND_IN_ROOTS = ("triton", "sgl_kernel", "sglang_kernel", "flashinfer", "flash_attn", "deep_gemm", "deep_ep",
                  "torchvision", "torchaudio", "cuda", "vllm",
                  "decord", "decord2", "torch_memory_saver", "quack", "cutlass", "tilelang", "flash_mla",
                  "sgl_deep_gemm", "humming_kernels", "nvshmem", "mooncake", "nixl", "kernels")
LABEL = "fleetctl GPU stand-in (no GPU code: placeholders only)"
VERSION = "0.0.0+fleetctl.standin"


class _Target(object):
    """What triton's active driver says of the current GPU: an NVIDIA device of the capability the
    probe was told (FLEETCTL_PROBE_CAPABILITY, "9.0" form, from the host's nvidia-smi facts)."""

    backend = "cuda"
    warp_size = 32

    def __init__(self):
        cap = os.environ.get("FLEETCTL_PROBE_CAPABILITY", "9.0").split(".")
        try:
            self.arch = int(cap[0]) * 10 + int(cap[1] if len(cap) > 1 else 0)
        except ValueError:
            self.arch = 90


SHAPES = {"triton.runtime.driver.active.get_current_target": _Target}


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(cls._path + "." + name)

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator
        return _placeholder(cls._path + "()")

    def __getitem__(cls, item):
        return cls

    def __iter__(cls):
        return iter(())

    def __bool__(cls):
        return False

    def __int__(cls):
        return 0

    def __index__(cls):
        return 0

    def __lt__(cls, other):
        return False

    __le__ = __gt__ = __ge__ = __lt__


def _placeholder(path):
    path = str(path)
    if path in SHAPES:
        return SHAPES[path]
    return _Meta(path.rsplit(".", 1)[-1], (), {"__doc__": LABEL, "__module__": "fleetctl_gpu_standin", "_path": path})


class _Module(type(sys)):
    def __getattr__(self, name):
        if name.startswith("__") and name not in ("__version__",):
            raise AttributeError(name)
        if name == "__version__":
            return VERSION
        value = _placeholder(self.__name__ + "." + name)
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in STAND_IN_ROOTS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _Module(spec.name)
        mod.__path__ = []
        mod.__version__ = VERSION
        mod.FLEETCTL_GPU_STANDIN = LABEL
        return mod

    def exec_module(self, module):
        if "." not in module.__name__:
            _tolerate_missing_ops()
        return None


_patched = []


def _tolerate_missing_ops():
    """SGLang registers fake (meta) implementations of the stand-in packages' torch ops at import:
    with no real op to attach to, such a registration is a no-op here (stand-in namespaces only)."""
    if _patched:
        return
    try:
        import torch.library as lib
    except ImportError:
        return
    _patched.append(True)
    try:  # torch must not take the triton stand-in for a real triton (torch.compile would use it)
        import torch.utils._triton as tt

        for attr in ("has_triton_package", "has_triton"):
            if hasattr(tt, attr):
                setattr(tt, attr, lambda *a, **k: False)
    except ImportError:
        pass
    for attr in ("register_fake", "impl_abstract"):
        real = getattr(lib, attr, None)
        if real is None:
            continue

        def make(real):
            def register(op, *args, **kwargs):
                name = op if isinstance(op, str) else ""
                if name.split("::")[0] not in STAND_IN_ROOTS:
                    return real(op, *args, **kwargs)
                try:
                    inner = real(op, *args, **kwargs)
                except (RuntimeError, ValueError):
                    inner = None

                def decorate(fn):
                    try:
                        return inner(fn) if callable(inner) else fn
                    except (RuntimeError, ValueError):
                        return fn
                if args and callable(args[0]):  # register_fake(op, fn): applied at once
                    return decorate(args[0])
                return decorate
            return register
        setattr(lib, attr, make(real))


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.append(_Finder())
