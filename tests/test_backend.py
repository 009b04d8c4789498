"""The backends against the interfaces the runtime asks of them (runtime/backend.py), checked on
the classes: CUDA's is built only where a GPU is."""
from __future__ import annotations

import inspect

from kiln.runtime.backend import Backend, Evicting, Recording
from kiln.runtime.cpu import CpuBackend
from kiln.runtime.cuda import CudaBackend


def _members(protocol) -> set[str]:
    return {n for n in vars(protocol) if not n.startswith("_")} | set(getattr(protocol, "__annotations__", {}))


def test_each_backend_has_what_the_runtime_asks_of_it():
    for protocol, backends in ((Backend, (CpuBackend, CudaBackend)), (Recording, (CpuBackend, CudaBackend)),
                               (Evicting, (CpuBackend,))):
        for backend in backends:
            missing = {n for n in _members(protocol) if not hasattr(backend, n)}
            assert not missing, (backend.__name__, protocol.__name__, missing)
    # CUDA evicts nothing (its timing flushes the L2 cache before every call)
    assert not hasattr(CudaBackend, "evicter")


def test_a_cpu_backend_is_one_by_isinstance():
    backend = CpuBackend()
    assert isinstance(backend, Backend) and isinstance(backend, Evicting) and isinstance(backend, Recording)


def test_methods_take_the_arguments_the_interface_names():
    for protocol, backends in ((Backend, (CpuBackend, CudaBackend)), (Recording, (CpuBackend, CudaBackend))):
        for name, member in vars(protocol).items():
            if name.startswith("_") or not callable(getattr(protocol, name)):
                continue
            want = [p for p in inspect.signature(getattr(protocol, name)).parameters if p != "self"]
            for backend in backends:
                got = [p for p in inspect.signature(getattr(backend, name)).parameters if p != "self"]
                assert got[:len(want)] == want or set(want) <= set(got), (backend.__name__, name, got, want)
