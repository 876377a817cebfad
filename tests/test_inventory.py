"""GPU inventory: the real NVML path on this machine, and the SDK boundary against a fake ``pynvml`` module."""

import json
import logging
import sys
import types
from types import SimpleNamespace

import pytest

from ones_pipeline.adapters.inventory import GpuInfo, Inventory, Node, discover
from ones_pipeline.core.types import Cluster

LOGGER = "ones_pipeline.adapters.inventory"


def _real_gpu_present() -> bool:
    try:
        import pynvml
    except ImportError:
        return False
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return pynvml.nvmlDeviceGetCount() > 0
    finally:
        pynvml.nvmlShutdown()


REAL_GPU = _real_gpu_present()


# ---------------------------------------------------------------- real NVML (no mock)


@pytest.mark.skipif(REAL_GPU, reason="a real NVIDIA GPU is present; the fallback path cannot be exercised")
def test_real_nvml_without_gpu_falls_back_to_cpu_slots(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    inv = discover(cpu_slots=3)
    assert (inv.kind, inv.slot_ids, inv.gpus, inv.num_slots, inv.gpus_per_node) == ("cpu", (0, 1, 2), (), 3, 3)
    assert "NVML" in inv.reason and "driver" in inv.reason
    assert inv.reason.endswith("using 3 configured CPU slots")
    records = [r for r in caplog.records if r.name == LOGGER]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert inv.reason in records[0].getMessage()
    with pytest.raises(ValueError, match="NVML, which is unavailable: no NVIDIA driver"):
        discover(gpus=[0])


@pytest.mark.skipif(not REAL_GPU, reason="needs a real NVIDIA GPU and driver")
def test_real_nvml_with_gpu_reports_sane_values():
    inv = discover()
    assert inv.kind == "gpu" and inv.reason.startswith("NVML: ")
    assert inv.slot_ids == tuple(range(len(inv.gpus))) and inv.num_slots >= 1
    for gpu in inv.gpus:
        assert gpu.name and gpu.name != "unknown NVIDIA GPU"
        assert gpu.uuid is None or gpu.uuid.startswith(("GPU-", "MIG-"))
        assert gpu.memory_total_mb > 1024
        assert gpu.memory_used_mb is None or 0 <= gpu.memory_used_mb <= gpu.memory_total_mb
        assert gpu.utilization_percent is None or 0 <= gpu.utilization_percent <= 100
    assert inv.cluster().num_gpus == inv.num_slots


# ---------------------------------------------------------------- fake pynvml at the SDK boundary


class FakeNvml:
    """Builds a module with the names of nvidia-ml-py's ``pynvml`` that the adapter uses."""

    def __init__(self, names, *, init_error=None, unsupported=(), broken=(), total_gib=80, used_mib=1024):
        self.names, self.init_error = list(names), init_error
        self.unsupported, self.broken = set(unsupported), set(broken)  # {(index, "util"|"mem"|"uuid")}, {index}
        self.total, self.used = total_gib * 2**30, used_mib * 2**20
        self.inits = self.shutdowns = 0
        m = self.module = types.ModuleType("pynvml")

        class NVMLError(Exception):
            pass

        m.NVMLError = NVMLError
        for name in ("LibraryNotFound", "DriverNotLoaded", "NotSupported", "GpuIsLost", "Uninitialized"):
            setattr(m, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {}))
        m.nvmlInit, m.nvmlShutdown = self._init, self._shutdown
        m.nvmlDeviceGetCount = self._live(lambda: len(self.names))
        m.nvmlDeviceGetHandleByIndex = self._live(self._handle)
        m.nvmlDeviceGetName = self._live(lambda h: self.names[h])
        m.nvmlDeviceGetUUID = self._live(lambda h: self._check(h, "uuid") or f"GPU-fake-{h}")
        m.nvmlDeviceGetMemoryInfo = self._live(
            lambda h: self._check(h, "mem") or SimpleNamespace(total=self.total, used=self.used * (h + 1))
        )
        m.nvmlDeviceGetUtilizationRates = self._live(
            lambda h: self._check(h, "util") or SimpleNamespace(gpu=10 * h, memory=5)
        )

    def _init(self):
        if self.init_error:
            raise getattr(self.module, f"NVMLError_{self.init_error}")()
        self.inits += 1

    def _shutdown(self):
        self.shutdowns += 1

    def _live(self, fn):
        def call(*args):
            if self.inits == self.shutdowns:  # as the real library: every call needs an open session
                raise self.module.NVMLError_Uninitialized()
            return fn(*args)

        return call

    def _handle(self, index):
        if not 0 <= index < len(self.names):
            raise self.module.NVMLError("invalid argument")
        if index in self.broken:
            raise self.module.NVMLError_GpuIsLost()
        return index

    def _check(self, handle, metric):
        if (handle, metric) in self.unsupported:
            raise self.module.NVMLError_NotSupported()


@pytest.fixture
def fake(monkeypatch):
    def install(names=("NVIDIA H200",) * 4, **kw) -> FakeNvml:
        nv = FakeNvml(names, **kw)
        monkeypatch.setitem(sys.modules, "pynvml", nv.module)
        return nv

    return install


def test_fake_mirrors_the_real_module_names():
    pynvml = pytest.importorskip("pynvml")
    nv = FakeNvml(["x"])
    fake_names = {n for n in dir(nv.module) if n.startswith("nvml") or n.startswith("NVMLError")}
    assert fake_names <= set(dir(pynvml))
    assert issubclass(pynvml.NVMLError_NotSupported, pynvml.NVMLError)


def test_four_gpus(fake, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    nv = fake()
    inv = discover(cpu_slots=2)
    assert (inv.kind, inv.slot_ids, inv.num_slots, inv.gpus_per_node) == ("gpu", (0, 1, 2, 3), 4, 4)
    assert inv.reason == "NVML: 4 x NVIDIA H200"
    assert inv.gpus[2] == GpuInfo(2, "NVIDIA H200", "GPU-fake-2", 80 * 1024.0, 3 * 1024.0, 20.0)
    assert (nv.inits, nv.shutdowns) == (1, 1)
    assert [r for r in caplog.records if r.name == LOGGER] == []


def test_unsupported_counter_is_none_and_others_are_read(fake):
    nv = fake(unsupported={(1, "util"), (2, "mem"), (3, "uuid")})
    a, b, c, d = discover().gpus
    assert b.utilization_percent is None and b.memory_used_mb == 2048.0
    assert c.memory_used_mb is None and c.memory_total_mb == 0.0 and c.utilization_percent == 20.0
    assert d.uuid is None and d.utilization_percent == 30.0
    assert a == GpuInfo(0, "NVIDIA H200", "GPU-fake-0", 81920.0, 1024.0, 0.0)
    assert nv.shutdowns == 1


def test_device_nvml_cannot_open_is_skipped_and_named(fake):
    fake(names=["A100", "A100", "T4"], broken={1})
    inv = discover()
    assert inv.slot_ids == (0, 2)
    assert inv.reason == "NVML: 1 x A100, 1 x T4 (skipped GPU 1: NVMLError_GpuIsLost)"
    with pytest.raises(ValueError, match=r"GPU index 1 not found; NVML indices present: \[0, 2\]"):
        discover(gpus=[1])


@pytest.mark.parametrize("error", ["DriverNotLoaded", "LibraryNotFound", "Uninitialized"])
def test_init_failure_falls_back_with_one_info_line(fake, caplog, error):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    nv = fake(init_error=error)
    inv = discover(cpu_slots=1)
    assert (inv.kind, inv.slot_ids, inv.gpus) == ("cpu", (0,), ())
    expected = {"DriverNotLoaded": "NVIDIA driver not loaded", "LibraryNotFound": "no NVIDIA driver",
                "Uninitialized": "NVML init failed (NVMLError_Uninitialized"}[error]
    assert inv.reason.startswith(expected) and inv.reason.endswith("using 1 configured CPU slot")
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in records] == [logging.INFO]
    assert nv.shutdowns == 0  # init never succeeded


def test_missing_module_falls_back(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    inv = discover()
    assert inv.kind == "cpu" and inv.reason.startswith("nvidia-ml-py is not installed")


def test_zero_devices_falls_back(fake, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    nv = fake(names=[])
    inv = discover(cpu_slots=2)
    assert (inv.kind, inv.slot_ids) == ("cpu", (0, 1))
    assert inv.reason == "NVML found no usable GPU: using 2 configured CPU slots"
    assert len([r for r in caplog.records if r.name == LOGGER]) == 1
    assert nv.shutdowns == 1


def test_log_goes_to_the_given_logger(fake, caplog):
    caplog.set_level(logging.INFO)
    fake(init_error="DriverNotLoaded")
    discover(log=logging.getLogger("ones.test.custom"))
    assert [r.name for r in caplog.records if r.name.startswith("ones")] == ["ones.test.custom"]


def test_explicit_indices(fake):
    nv = fake()
    inv = discover(gpus=[3, 1])
    assert inv.slot_ids == (3, 1) and [x.index for x in inv.gpus] == [3, 1]
    assert inv.reason == "NVML: 2 x NVIDIA H200 (indices 3, 1 of 4)"
    assert discover(gpus=(1, 3)).slot_ids == (1, 3)
    with pytest.raises(ValueError, match=r"GPU index 7 not found; NVML indices present: \[0, 1, 2, 3\]"):
        discover(gpus=[1, 7])
    assert nv.inits == nv.shutdowns == 3


def test_explicit_indices_without_nvml_is_an_error(fake):
    fake(init_error="DriverNotLoaded")
    with pytest.raises(ValueError, match=r"gpus=\[0\] needs NVML, which is unavailable: NVIDIA driver not loaded"):
        discover(gpus=[0])


def test_none_makes_no_nvml_call(fake, caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    nv = fake()
    inv = discover(cpu_slots=2, gpus="none")
    assert (inv.kind, inv.slot_ids) == ("cpu", (0, 1)) and "gpus='none'" in inv.reason
    assert nv.inits == 0 and [r for r in caplog.records if r.name == LOGGER] == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"cpu_slots": 0}, "cpu_slots must be >= 1, got 0"),
        ({"cpu_slots": 2.5}, "cpu_slots must be >= 1, got 2.5"),
        ({"gpus": "all"}, "gpus must be 'auto', 'none' or a list of GPU indices, got 'all'"),
        ({"gpus": []}, "empty list"),
        ({"gpus": [1, 1]}, "index twice"),
        ({"gpus": [-1]}, "every index in gpus must be >= 0, got -1"),
        ({"gpus_per_node": 0}, "gpus_per_node must be >= 1, got 0"),
    ],
)
def test_argument_errors(fake, kwargs, match):
    nv = fake()
    with pytest.raises(ValueError, match=match):
        discover(**kwargs)
    assert nv.inits == 0  # rejected before touching NVML


# ---------------------------------------------------------------- Inventory values


def test_cluster_and_to_dict(fake):
    fake()
    inv = discover()
    cluster = inv.cluster()
    assert isinstance(cluster, Cluster) and cluster.num_gpus == 4 and cluster.gpus_per_node == (4,)
    two_nodes = discover(gpus_per_node=2).cluster()
    assert two_nodes.gpus_per_node == (2, 2)
    cpu = discover(cpu_slots=3, gpus="none")
    assert cpu.cluster().num_gpus == 3 and cpu.cluster().num_nodes == 1
    data = json.loads(json.dumps(inv.to_dict()))
    assert data["kind"] == "gpu" and data["slot_ids"] == [0, 1, 2, 3] and data["num_slots"] == 4
    assert data["gpus"][1] == {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-fake-1",
                               "memory_total_mb": 81920.0, "memory_used_mb": 2048.0, "utilization_percent": 10.0}


def test_inventory_rejects_inconsistent_values():
    gpu = GpuInfo(0, "x", None, 1.0, None, None)
    with pytest.raises(ValueError, match="kind must be 'gpu' or 'cpu'"):
        Inventory("tpu", (0,), (), "r", 1)
    with pytest.raises(ValueError, match="do not match"):
        Inventory("gpu", (1,), (gpu,), "r", 1)
    assert Inventory("gpu", (0,), (gpu,), "r", 1).num_slots == 1


def test_nodes_follow_gpus_per_node_and_give_the_cluster(fake):
    fake()
    inv = discover(gpus_per_node=3)
    assert [(n.name, n.slot_ids) for n in inv.nodes] == [("node-0", (0, 1, 2)), ("node-1", (3,))]
    assert inv.cluster().gpus_per_node == (3, 1)
    assert inv.to_dict()["nodes"][1] == {"name": "node-1", "slot_ids": [3]}
    with pytest.raises(ValueError, match="not slot_ids"):
        Inventory("cpu", (0, 1), (), "r", 2, nodes=(Node("a", (1, 0)),))


def test_sources_from_the_cluster_config(fake):
    from ones_pipeline.adapters.inventory import NvmlInventory, StaticInventory, inventory_source
    from ones_pipeline.config import ClusterConfig

    nv = fake()
    static = inventory_source(ClusterConfig(gpus="none", cpu_slots=3))
    assert isinstance(static, StaticInventory)
    assert static.discover().slot_ids == (0, 1, 2) and nv.inits == 0
    listed = inventory_source(ClusterConfig(gpus=(2, 0), cpu_slots=1, gpus_per_node=1))
    assert isinstance(listed, NvmlInventory)
    inv = listed.discover()
    assert inv.kind == "gpu" and inv.slot_ids == (2, 0) and inv.cluster().gpus_per_node == (1, 1)
    assert inventory_source(ClusterConfig()).discover().num_slots == 4
