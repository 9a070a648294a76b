"""Backend selection: decided once, lazy about triton, explicit about what it refuses."""

import dataclasses
import subprocess
import sys

import pytest
import torch
from tieredkv.kernels import KernelBackend, reference, select_backend

KERNEL_NAMES = (
    "paged_prefill_attention",
    "paged_decode_attention",
    "gather_pages",
    "scatter_pages",
)


@pytest.mark.parametrize("prefer", [None, "torch", "reference"])
def test_cpu_gets_the_torch_reference(prefer):
    backend = select_backend(torch.device("cpu"), prefer=prefer)
    assert backend.name == "torch"
    for name in KERNEL_NAMES:
        assert getattr(backend, name) is getattr(reference, name)


def test_backend_is_frozen():
    backend = select_backend(torch.device("cpu"))
    assert isinstance(backend, KernelBackend)
    with pytest.raises(dataclasses.FrozenInstanceError):
        backend.name = "triton"


def test_unknown_preference_is_refused():
    with pytest.raises(ValueError, match="prefer"):
        select_backend(torch.device("cpu"), prefer="cuda")


def test_triton_is_selectable_where_it_runs(triton_kernels, device):
    backend = select_backend(device, prefer="triton")
    assert backend.name == "triton"
    assert backend.gather_pages is triton_kernels.gather_pages


def test_triton_on_cpu_without_the_interpreter_is_refused(triton_kernels, monkeypatch):
    monkeypatch.setattr("tieredkv.kernels.triton_support.INTERPRETING", False)
    with pytest.raises(ValueError, match="device"):
        select_backend(torch.device("cpu"), prefer="triton")
    pool = torch.zeros(1, 2, 2, 4, 1, 8)
    with pytest.raises(ValueError, match="kv_pool: the Triton kernels need a CUDA tensor"):
        triton_kernels.gather_pages(pool, torch.tensor([1]))


def test_import_is_lazy_and_cuda_without_triton_falls_back_to_torch():
    # A fresh interpreter in which `import triton` fails.
    script = (
        "import sys, torch\n"
        "sys.modules['triton'] = None\n"
        "import tieredkv.kernels as k\n"
        "assert 'tieredkv.kernels.triton_prefill' not in sys.modules\n"
        "print(k.select_backend(torch.device('cuda')).name)\n"
        "try:\n"
        "    k.select_backend(torch.device('cuda'), prefer='triton')\n"
        "except ImportError as error:\n"
        "    print('ImportError', error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "torch"
    assert lines[1].startswith("ImportError") and "pip install" in lines[1]
    assert "using the torch reference" in result.stderr


@pytest.mark.parametrize(("capability", "expected"), [((9, 0), "triton"), ((7, 5), "torch")])
def test_cuda_picks_triton_from_ampere_on(triton_kernels, monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert select_backend(torch.device("cuda")).name == expected
