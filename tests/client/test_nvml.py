"""The GPU's health through NVML (issue 34), against a fake NVML at the boundary: one that
answers like an H100's driver, and one with each failure mode (a field the GPU does not
support, no permission, a call this pynvml lacks, a lost GPU, a driver that answers
errors, a probe that hangs), through the probe, its sampler thread and a real Monitor."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

import pytest
import torch

from monitor_client import Monitor, MonitorSettings
from monitor_client._nvml import (
    FIELDS,
    FUNCTION_NOT_FOUND,
    GPU_IS_LOST,
    HW_SLOWDOWN,
    NO_PERMISSION,
    NOT_SUPPORTED,
    SW_POWER_CAP,
    SW_THERMAL,
    TIMEOUT,
    GpuSampler,
    NvmlProbe,
    nvml_probe,
)
from tests.eventually import eventually

UNKNOWN = 999


class NVMLError(Exception):
    """pynvml's error: the return code is ``value``."""

    def __init__(self, value):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """The calls NvmlProbe makes, answering like an H100 SXM at work. ``fail[name]`` makes
    that call raise NVMLError(code); ``calls`` counts each call and ``threads`` notes who
    called; ``xids`` is the queue of XID events the driver holds."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1

    def __init__(self):
        self.fail: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.threads: set[str] = set()
        self.xids: list[int] = []
        self.throttle = SW_POWER_CAP
        self.ecc = {(0, 0): 3, (0, 1): 120, (1, 0): 0, (1, 1): 0}  # (type, counter): count
        self.remap = (2, 0, False, False)
        self.pcie = (16, 16, 5, 5)
        self.hang: threading.Event | None = None
        self.blocked = threading.Event()  # a call is waiting on ``hang``

    def _answer(self, name, value):
        self.calls[name] = self.calls.get(name, 0) + 1
        self.threads.add(threading.current_thread().name)
        hang = self.hang
        if hang is not None:
            self.blocked.set()
            hang.wait(10)
        if name in self.fail:
            raise NVMLError(self.fail[name])
        return value

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802 - NVML's names
        return self._answer("utilization", SimpleNamespace(gpu=97))

    def nvmlDeviceGetTemperature(self, h, sensor):  # noqa: N802
        return self._answer("temperature", 71)

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        return self._answer("power", 690_000)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):  # noqa: N802
        return self._answer("power_limit", 700_000)

    def nvmlDeviceGetClockInfo(self, h, clock):  # noqa: N802
        return self._answer("clock", 1755)

    def nvmlDeviceGetMaxClockInfo(self, h, clock):  # noqa: N802
        return self._answer("max_clock", 1980)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):  # noqa: N802
        return self._answer("throttle", self.throttle)

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):  # noqa: N802
        return self._answer("ecc", self.ecc[(kind, counter)])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):  # noqa: N802
        return self._answer("retired_pages", 0)

    def nvmlDeviceGetRemappedRows(self, h):  # noqa: N802
        return self._answer("remapped_rows", self.remap)

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):  # noqa: N802
        return self._answer("pcie", self.pcie[0])

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):  # noqa: N802
        return self._answer("pcie_max", self.pcie[1])

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):  # noqa: N802
        return self._answer("pcie_gen", self.pcie[2])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):  # noqa: N802
        return self._answer("pcie_gen_max", self.pcie[3])

    def nvmlEventSetCreate(self):  # noqa: N802
        return self._answer("event_set", "set")

    def nvmlDeviceRegisterEvents(self, h, types, events):  # noqa: N802
        return self._answer("register", None)

    def nvmlEventSetWait_v2(self, events, timeout_ms):  # noqa: N802
        self._answer("event_wait", None)
        if not self.xids:
            raise NVMLError(TIMEOUT)
        return SimpleNamespace(eventType=0x8, eventData=self.xids.pop(0))

    def nvmlDeviceGetIndex(self, h):  # noqa: N802
        return 3

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return b"GPU-1b2c3d4e-0000-1111-2222-333344445555"

    def nvmlDeviceGetPciInfo(self, h):  # noqa: N802
        return SimpleNamespace(busId="00000000:1B:00.0")

    def nvmlDeviceGetSerial(self, h):  # noqa: N802
        raise NVMLError(NOT_SUPPORTED)

    def nvmlSystemGetDriverVersion(self):  # noqa: N802
        return "580.159.04"


H100_READING = {
    "utilization": 0.97, "temperature_c": 71.0, "power_w": 690.0, "power_limit_w": 700.0,
    "sm_clock_mhz": 1755.0, "sm_clock_max_mhz": 1980.0, "throttle_reasons": 4.0,
    "throttle_thermal": 0.0, "throttle_power": 1.0, "throttle_hw_slowdown": 0.0,
    "ecc_corrected_volatile": 3.0, "ecc_corrected_aggregate": 120.0,
    "ecc_uncorrected_volatile": 0.0, "ecc_uncorrected_aggregate": 0.0,
    "retired_pages_pending": 0.0, "remapped_rows_correctable": 2.0,
    "remapped_rows_uncorrectable": 0.0, "remapped_rows_pending": 0.0,
    "remapped_rows_failure": 0.0, "pcie_link_width": 16.0, "pcie_link_width_max": 16.0,
    "pcie_link_gen": 5.0, "pcie_link_gen_max": 5.0, "xid_count": 0.0,
}


def test_a_healthy_gpu_reads_every_signal_and_says_which_gpu_it_is():
    nvml = FakeNvml()
    probe = NvmlProbe(nvml, handle=0)
    assert probe.read() == H100_READING
    assert set(H100_READING) <= set(FIELDS)  # what docs/format.md describes
    assert probe.describe() == {"gpu_index": 3, "gpu_uuid": "GPU-1b2c3d4e-0000-1111-2222-333344445555",
                                "gpu_pci_bus_id": "00000000:1B:00.0",
                                "driver_version": "580.159.04"}  # no serial: unsupported


def test_throttle_reasons_and_the_problems_a_sick_gpu_shows():
    nvml = FakeNvml()
    nvml.throttle = SW_THERMAL | HW_SLOWDOWN
    nvml.ecc[(1, 0)] = 2
    nvml.remap = (2, 1, True, False)
    nvml.pcie = (8, 16, 5, 5)
    nvml.xids = [79, 48]
    reading = NvmlProbe(nvml, handle=0).read()
    assert reading is not None
    assert (reading["throttle_thermal"], reading["throttle_power"],
            reading["throttle_hw_slowdown"]) == (1.0, 0.0, 1.0)
    assert reading["ecc_uncorrected_volatile"] == 2.0
    assert (reading["remapped_rows_uncorrectable"], reading["remapped_rows_pending"]) == (1.0, 1.0)
    assert reading["pcie_link_width"] == 8.0 and reading["pcie_link_width_max"] == 16.0
    assert (reading["xid_count"], reading["xid_last"]) == (2.0, 48.0)


@pytest.mark.parametrize("call, code, gone", [
    ("ecc", NOT_SUPPORTED, {"ecc_corrected_volatile", "ecc_corrected_aggregate",
                            "ecc_uncorrected_volatile", "ecc_uncorrected_aggregate"}),
    ("register", NO_PERMISSION, {"xid_count"}),
    ("remapped_rows", FUNCTION_NOT_FOUND, {"remapped_rows_correctable",
                                           "remapped_rows_uncorrectable",
                                           "remapped_rows_pending", "remapped_rows_failure"}),
])
def test_a_field_the_gpu_cannot_give_costs_its_own_fields_and_is_not_asked_again(
        call, code, gone):
    nvml = FakeNvml()
    nvml.fail[call] = code
    probe = NvmlProbe(nvml, handle=0)
    for _ in range(3):
        reading = probe.read()
        assert reading == {k: v for k, v in H100_READING.items() if k not in gone}
    assert nvml.calls[call] == 1 and probe.errors == 0


def test_an_older_pynvml_without_a_call_falls_back_or_leaves_the_group_out():
    nvml = FakeNvml()
    nvml.nvmlDeviceGetCurrentClocksThrottleReasons = nvml.nvmlDeviceGetCurrentClocksEventReasons
    del FakeNvml.nvmlDeviceGetCurrentClocksEventReasons  # the pre-535 name only
    try:
        reading = NvmlProbe(nvml, handle=0).read()
    finally:
        FakeNvml.nvmlDeviceGetCurrentClocksEventReasons = (
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons.__func__)
    assert reading == H100_READING
    bare = SimpleNamespace(**{k: getattr(nvml, k) for k in dir(nvml)
                              if k.startswith("NVML") or k in (
                                  "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage")})
    assert NvmlProbe(bare, handle=0).read() == {"temperature_c": 71.0, "power_w": 690.0}


def test_a_driver_that_answers_errors_costs_those_fields_and_is_counted():
    nvml = FakeNvml()
    nvml.fail["power"] = UNKNOWN
    nvml.fail["event_wait"] = TIMEOUT - 1  # an odd error from the event queue
    probe = NvmlProbe(nvml, handle=0)
    first = probe.read()
    assert first is not None and "power_w" not in first and "xid_count" not in first
    assert first["nvml_errors"] == 2.0 and first["temperature_c"] == 71.0
    nvml.fail.clear()
    again = probe.read()
    assert again == {**H100_READING, "nvml_errors": 2.0}  # asked again, and it answered


def test_a_lost_gpu_says_so_and_is_asked_again_next_time():
    nvml = FakeNvml()
    nvml.fail["utilization"] = GPU_IS_LOST
    probe = NvmlProbe(nvml, handle=0)
    assert probe.read() == {"gpu_lost": 1.0}
    assert "temperature" not in nvml.calls  # nothing more asked of a GPU that is gone
    del nvml.fail["utilization"]
    assert probe.read() == H100_READING


def test_every_call_failing_gives_a_reading_of_errors_and_no_nvml_gives_none(monkeypatch):
    nvml = FakeNvml()
    for name in ("utilization", "temperature", "power", "power_limit", "clock", "throttle",
                 "ecc", "retired_pages", "remapped_rows", "pcie", "event_set"):
        nvml.fail[name] = UNKNOWN
    assert NvmlProbe(nvml, handle=0).read() == {"nvml_errors": 11.0}
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    assert nvml_probe(0) is None


def test_the_probe_finds_the_gpu_by_uuid_whatever_the_cuda_numbering(monkeypatch):
    asked = []
    fake = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: asked.append(("uuid", uuid)) or "by-uuid",
        nvmlDeviceGetHandleByIndex=lambda i: asked.append(("index", i)) or "by-index")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    probe = nvml_probe(0, "1b2c3d4e-0000-1111-2222-333344445555")
    assert probe is not None and probe._handle == "by-uuid"
    assert asked == [("uuid", "GPU-1b2c3d4e-0000-1111-2222-333344445555")]
    fake.nvmlInit = lambda: (_ for _ in ()).throw(NVMLError(9))  # DRIVER_NOT_LOADED
    assert nvml_probe(0, "x") is None


def test_the_sampler_keeps_the_last_reading_while_a_probe_hangs_or_raises():
    nvml = FakeNvml()
    sampler = GpuSampler(NvmlProbe(nvml, handle=0), interval=0.01).start()
    try:
        assert sampler.wait_first(5.0) and sampler.read() == H100_READING
        nvml.hang = threading.Event()  # the next call blocks, as on a dying GPU
        eventually(nvml.blocked.is_set, what="the sampler's next call, blocked")
        assert sampler.read() == H100_READING  # at once, the last reading
    finally:
        assert nvml.hang is not None
        nvml.hang.set()
        nvml.hang = None
        sampler.close()

    class Broken:
        def read(self):
            raise RuntimeError("probe bug")

    broken = GpuSampler(Broken(), interval=0.01).start()
    assert broken.wait_first(5.0) and broken.read() is None
    broken.close()


def test_a_monitor_sends_the_readings_with_its_steps_read_on_the_sampler_thread(
        receiver, tmp_path):
    nvml = FakeNvml()
    nvml.throttle = SW_THERMAL
    mon = Monitor(url=receiver.url, run_id="gpu-signals", settings=MonitorSettings(
        spool_dir=tmp_path, install_hooks=False, linger=0.02,
        gpu_probe=NvmlProbe(nvml, handle=0), gpu_sample_interval=0.01))
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, opt)
    for step in (1, 2, 3):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=1.0)
    assert mon.close(timeout=10)
    steps = receiver.of_kind("step")
    assert len(steps) == 3
    for rec in steps:
        assert rec["gpu"]["throttle_thermal"] == 1.0 and rec["gpu"]["sm_clock_max_mhz"] == 1980
    hardware = receiver.of_kind("run")[0]["hardware"]
    assert hardware["gpu_uuid"].startswith("GPU-1b2c") and hardware["gpu_index"] == 3
    assert nvml.threads == {"monitor-client-gpu"}  # never the training or sender thread
    # close() stopped the sampler: its thread ended (a call under way then has landed),
    # so no call can come after.
    eventually(lambda: "monitor-client-gpu" not in {t.name for t in threading.enumerate()},
               what="the sampler's thread ended")
