"""What the vLLM GPU worker path needs of vLLM 0.32, checked on the CPU (the GPU machine has no vLLM, so the GPU
worker itself never runs; a new user's static review of it, session 54, found these):

* importing ``vllm_specla.worker.worker`` (vLLM imports it to resolve ``worker_cls`` on every platform) must not
  import vLLM-CPU's ``cpu_worker``, whose ``cpu.shm`` replaces torch.cuda / torch.accelerator functions process-wide;
* on a GPU platform the config hook turns eager mode on (vLLM would capture CUDA graphs of a step without the GDN
  mixer's host-side plan) and keeps vLLM on its V1 model runner, which the SpecLA runner subclasses;
* the worker classes resolve to one class object each, picklable by reference.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import types

import pytest

pytest.importorskip("vllm")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_worker_module_import_leaves_torch_cuda_alone():
    """A fresh interpreter: vLLM's GPU worker modules, then ours; torch's CUDA / accelerator functions and
    ``Tensor.pin_memory`` are the same objects before and after, and vLLM-CPU's cpu_worker is not imported."""
    code = """
import sys, torch
import vllm.v1.worker.gpu_worker, vllm.v1.worker.gpu_model_runner
names = [("torch.accelerator", "get_memory_info"), ("torch.accelerator", "synchronize"), ("torch.cuda", "Event"),
         ("torch.cuda", "Stream"), ("torch.cuda", "current_stream"), ("torch", "Event"), ("torch.Tensor", "pin_memory")]
def get(mod, name):
    obj = torch
    for part in mod.split(".")[1:]:
        obj = getattr(obj, part)
    return getattr(obj, name, None)
before = {n: get(*n) for n in names}
import vllm_specla.worker.worker as w
changed = [".".join(n) for n in names if get(*n) is not before[n]]
print("changed", changed, "cpu_worker", "vllm.v1.worker.cpu_worker" in sys.modules)
"""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                       cwd=REPO, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "changed [] cpu_worker False" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_worker_classes_resolve_once_and_pickle():
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker

    from vllm_specla.worker import worker as w

    for name, base in (("SpeclaCPUWorker", CPUWorker), ("SpeclaGPUWorker", Worker)):
        cls = getattr(w, name)
        assert cls is getattr(w, name), name  # one class object (vLLM resolves worker_cls by name)
        assert issubclass(cls, base) and cls.__qualname__ == name and cls.__module__ == w.__name__
        assert pickle.loads(pickle.dumps(cls)) is cls
    from vllm_specla.worker.worker import SpeclaCPUWorker  # noqa: F401  (a from-import goes through __getattr__)

    with pytest.raises(AttributeError):
        w.NoSuchWorker  # noqa: B018


def test_gpu_runner_settings(monkeypatch):
    from vllm_specla.worker.patches import _gpu_runner_settings

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    mc = types.SimpleNamespace(enforce_eager=False)
    _gpu_runner_settings(mc)
    assert mc.enforce_eager is True and os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # a user's explicit choice is kept (the worker refuses it)
    _gpu_runner_settings(mc)
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"


def test_config_hook_on_a_gpu_platform(monkeypatch):
    """The hook, with vLLM's platform answering as CUDA: GPU worker, eager mode, the V1 runner. On the CPU
    platform eager mode is left as given."""
    import vllm.platforms

    from vllm_specla.worker.patches import SpeclaGDNConfigHook

    hf = _hf_config(os.path.join(REPO, "models", "specla-gdn-tiny", "target"))

    def vc(eager):
        return types.SimpleNamespace(
            model_config=types.SimpleNamespace(hf_config=hf, enforce_eager=eager),
            cache_config=types.SimpleNamespace(enable_prefix_caching=False),
            parallel_config=types.SimpleNamespace(tensor_parallel_size=1, worker_cls="auto",
                                                  distributed_executor_backend=None, data_parallel_backend="mp"))

    cpu = vc(False)
    SpeclaGDNConfigHook.verify_and_update_config(cpu)
    assert cpu.parallel_config.worker_cls.endswith("SpeclaCPUWorker") and cpu.model_config.enforce_eager is False

    fake = types.SimpleNamespace(is_cpu=lambda: False, is_cuda_alike=lambda: True)
    monkeypatch.setattr(vllm.platforms, "current_platform", fake, raising=False)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    gpu = vc(False)
    SpeclaGDNConfigHook.verify_and_update_config(gpu)
    assert gpu.parallel_config.worker_cls == "vllm_specla.worker.worker.SpeclaGPUWorker"
    assert gpu.model_config.enforce_eager is True and os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0"


def _hf_config(path):
    from vllm_specla.models.config import GatedDeltaNetConfig

    return GatedDeltaNetConfig.from_pretrained(path)


def test_kv_connectors_and_offloading_are_refused():
    """A KV connector or KV offloading would move the state page by page; the plugin lays a layer's states out per
    state (``bind_kv_cache``), so they are refused at start, naming the field."""
    from vllm_specla.models.config import UnsupportedConfigError
    from vllm_specla.worker.patches import _check_no_kv_transfer

    def vc(connector=None, offload=None):
        kv = None if connector is None else types.SimpleNamespace(kv_connector=connector)
        return types.SimpleNamespace(kv_transfer_config=kv,
                                     cache_config=types.SimpleNamespace(kv_offloading_size=offload))

    _check_no_kv_transfer(vc())
    _check_no_kv_transfer(vc(connector=""))  # a KVTransferConfig without a connector moves nothing
    with pytest.raises(UnsupportedConfigError, match=r"^kv_transfer_config: KV connector 'NixlConnector'"):
        _check_no_kv_transfer(vc(connector="NixlConnector"))
    with pytest.raises(UnsupportedConfigError, match=r"^kv_offloading_size=4\.0: .*allowed: unset"):
        _check_no_kv_transfer(vc(offload=4.0))
