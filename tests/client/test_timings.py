"""The client's split of a data-parallel step: all-reduce wait and own compute
(``_timings.py``), through a real Monitor and a loopback receiver."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from monitor_client import Monitor, MonitorSettings
from monitor_client._timings import StepTimings

WAIT = 0.05


def _train(url: str, tmp_path, world_size: int, steps: int = 4, **log) -> None:
    mon = Monitor(url=url, project="timings", run_id=f"timings-{world_size}",
                  settings=MonitorSettings(spool_dir=tmp_path, world_size=world_size, rank=0,
                                           install_hooks=False, gpu_probe=None))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, opt)
    batches = [torch.randn(4, 8) for _ in range(steps)]
    for step, x in enumerate(mon.timed(batches), 1):
        model(x).pow(2).mean().backward()
        time.sleep(WAIT)  # where DDP's end-of-backward waits for the peers' all-reduce
        opt.step()
        opt.zero_grad()
        mon.log_step(step, **log)
    mon.close()


def test_a_distributed_step_is_split_into_wait_and_compute(receiver, tmp_path):
    _train(receiver.url, tmp_path, world_size=4)
    steps = receiver.of_kind("step")
    assert len(steps) == 4
    for r in steps:
        assert r["sync_wait_time"] >= WAIT
        assert r["compute_time"] >= 0
        parts = r["sync_wait_time"] + r["compute_time"] + (r["data_time"] or 0)
        assert abs(parts - r["step_time"]) < 1e-9


def test_a_single_process_run_sends_no_split(receiver, tmp_path):
    _train(receiver.url, tmp_path, world_size=1)
    steps = receiver.of_kind("step")
    assert steps and all(r.get("sync_wait_time") is None for r in steps)
    assert all(r.get("compute_time") is None for r in steps)


def test_the_scripts_own_figures_win(receiver, tmp_path):
    _train(receiver.url, tmp_path, world_size=4, sync_wait_time=0.5, compute_time=0.25)
    steps = receiver.of_kind("step")
    assert steps and {(r["sync_wait_time"], r["compute_time"]) for r in steps} == {(0.5, 0.25)}


def test_a_closure_step_has_no_gap_to_measure():
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=1)
    timings = StepTimings(list(model.parameters()), opt).attach()

    def closure():
        opt.zero_grad()
        loss = model(torch.ones(2, 3)).sum()
        loss.backward()  # inside step(): after the optimizer's pre-hook
        return loss

    opt.step(closure)
    assert timings.take() is None
    model(torch.ones(2, 3)).sum().backward()
    opt.step(closure)  # an earlier backward does not count as this step's wait either
    assert timings.take() is None
    timings.detach()


# -- CUDA events (issue 34): a fake at the boundary, torch.cuda.Event's four calls ----------


class FakeEvent:
    """Stands in for ``torch.cuda.Event(enable_timing=True)``: ``record()`` stamps the
    device clock the test sets (``FakeEvent.now``); ``query()`` answers ``done``;
    ``elapsed_time`` is CUDA's, in milliseconds. It notes which thread read it, and a
    ``synchronize()`` (a wait) fails the test."""

    now = 0.0
    done = True
    made = 0
    records = 0
    readers: set[str] = set()

    def __init__(self):
        FakeEvent.made += 1
        self.t = None

    @classmethod
    def reset(cls):
        cls.now, cls.done, cls.made, cls.records, cls.readers = 0.0, True, 0, 0, set()

    def record(self, stream=None):
        FakeEvent.records += 1
        self.t = FakeEvent.now

    def query(self):
        FakeEvent.readers.add(threading.current_thread().name)
        return FakeEvent.done and self.t is not None

    def elapsed_time(self, end):
        FakeEvent.readers.add(threading.current_thread().name)
        return (end.t - self.t) * 1000.0

    def synchronize(self):
        raise AssertionError("a CUDA event was waited on")


@pytest.fixture
def fake_events():
    FakeEvent.reset()
    yield FakeEvent
    FakeEvent.reset()


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _event_step(model, opt, grad_at, wait, micro_batches=1):
    for k in range(micro_batches):
        FakeEvent.now = grad_at + k
        model(torch.randn(4, 8)).pow(2).mean().backward()
    FakeEvent.now += wait  # the device waits this long for the all-reduce
    opt.step()
    opt.zero_grad()


def test_events_measure_the_gap_from_the_last_gradient_to_the_optimizer(fake_events):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timings = StepTimings(list(model.parameters()), opt, events=FakeEvent).attach()
    assert timings.on_device
    got = []
    for step, wait in enumerate((0.2, 0.03, 0.05, 0.4), 1):
        # gradient accumulation on step 3: the last micro-batch's gradient ends compute
        _event_step(model, opt, 10.0 * step, wait, micro_batches=2 if step == 3 else 1)
        got.append(tuple(None if x is None else round(x, 9) for x in timings.take().read()[:2]))
    # step 1 learns which parameter's gradient comes last and has no step before it; the
    # span runs from one optimizer step to the next on the device's clock
    assert got == [(None, None), (0.03, 9.83), (0.05, 11.02), (0.4, 9.35)]
    # an optimizer event a step, a last-gradient event from step 2 on (recorded once per
    # micro-batch): no event per parameter
    assert FakeEvent.made == 1 + 2 + 2 + 2 and FakeEvent.records == 1 + 2 + 3 + 2
    timings.detach()


def test_events_whose_work_is_not_done_give_no_split(fake_events):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timings = StepTimings(list(model.parameters()), opt, events=FakeEvent).attach()
    for step in (1, 2):
        _event_step(model, opt, 10.0 * step, 0.1)
        events = timings.take()
    FakeEvent.done = False
    assert events.read() == (None, None, None)  # query() said not yet: no number, no wait
    FakeEvent.done = True
    assert round(events.read()[0], 9) == 0.1
    opt.step()  # a GradScaler that skipped the step would not call it: no events then
    assert timings.take() is not None
    timings.detach()


def test_a_step_whose_last_gradient_changes_gives_no_wait_once(fake_events):
    model = _mlp()
    first = model[0]  # backward ends with the input layer's gradients
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    timings = StepTimings(list(model.parameters()), opt, events=FakeEvent).attach()
    got = []
    for step in range(1, 6):
        first.requires_grad_(step != 3)  # step 3: no gradient there, the head's comes last
        _event_step(model, opt, 10.0 * step, 0.07)
        wait = timings.take().read()[0]
        got.append(wait if wait is None else round(wait, 9))
    first.requires_grad_(True)
    # step 3's last gradient is another parameter's, and so is the one expected on step 4
    assert got == [None, 0.07, None, None, 0.07]
    timings.detach()


def test_a_closure_step_with_events_has_no_gap(fake_events):
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.LBFGS(model.parameters(), max_iter=1)
    timings = StepTimings(list(model.parameters()), opt, events=FakeEvent).attach()

    def closure():
        opt.zero_grad()
        loss = model(torch.ones(2, 3)).sum()
        loss.backward()  # inside step(): after the optimizer's pre-hook
        return loss

    for _ in range(3):
        opt.step(closure)
        assert timings.take().read()[0] is None
    timings.detach()


def _train_on_events(url, tmp_path, monkeypatch, waits, **log):
    # The boundary: these parameters "are on CUDA", so the split's points are events.
    monkeypatch.setattr("monitor_client._timings.device_events", lambda params: FakeEvent)
    mon = Monitor(url=url, project="timings", run_id="timings-events",
                  settings=MonitorSettings(spool_dir=tmp_path, world_size=4, rank=0,
                                           install_hooks=False, gpu_probe=None, linger=0.05))
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, opt)
    assert mon._timings is not None and mon._timings.on_device
    for step, wait in enumerate(waits, 1):
        _event_step(model, opt, 10.0 * step, wait)
        mon.log_step(step, **log)
    assert mon.close(timeout=10)


def test_a_cuda_run_sends_the_event_split_read_off_the_training_thread(
        receiver, tmp_path, monkeypatch, fake_events):
    _train_on_events(receiver.url, tmp_path, monkeypatch, (0.5, 0.01, 0.02, 0.03))
    steps = sorted(receiver.of_kind("step"), key=lambda r: r["step"])
    assert [r.get("sync_wait_time") for r in steps][0] is None  # learning the order
    waits = (0.5, 0.01, 0.02, 0.03)
    for k, r in enumerate(steps[1:], 1):
        assert r["sync_wait_time"] == pytest.approx(waits[k])
        # compute is the device's step (optimizer to optimizer) less the wait: the host's
        # step_time (microseconds here: nothing waits on the fake device) plays no part
        span = 10.0 + waits[k] - waits[k - 1]
        assert r["compute_time"] == pytest.approx(span - waits[k])
        assert r["step_time"] < span  # the host's, not the device's
    # read by the sender thread, never by the training thread, and never waited on
    assert FakeEvent.readers and threading.current_thread().name not in FakeEvent.readers


def test_the_scripts_own_figures_win_over_the_events(
        receiver, tmp_path, monkeypatch, fake_events):
    _train_on_events(receiver.url, tmp_path, monkeypatch, (0.01, 0.02, 0.03),
                     sync_wait_time=0.5, compute_time=0.25)
    steps = receiver.of_kind("step")
    assert steps and {(r["sync_wait_time"], r["compute_time"]) for r in steps} == {(0.5, 0.25)}


def test_a_cuda_run_sends_the_device_s_idle_part_of_each_data_wait(
        receiver, tmp_path, monkeypatch, fake_events):
    """The host waits 20 ms for every batch; the device, on its own clock, sat idle for 15
    ms of it on step 2, none on step 3 (work queued before the wait outlasted it: a host
    running ahead), 5 ms on step 4. ``data_idle_time`` is that part, and the step's compute
    leaves out the idle time rather than the host's wait. Read on the sender thread."""
    monkeypatch.setattr("monitor_client._timings.device_events", lambda params: FakeEvent)
    mon = Monitor(url=receiver.url, project="timings", run_id="timings-idle",
                  settings=MonitorSettings(spool_dir=tmp_path, world_size=4, rank=0,
                                           install_hooks=False, gpu_probe=None, linger=0.05))
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, opt)
    idle, wait = (0.01, 0.015, 0.0, 0.005), 0.1

    def loader():
        for gap in idle:
            time.sleep(0.02)  # the host's wait for the batch
            FakeEvent.now += gap  # ... of which the device idled this much
            yield torch.randn(4, 8)

    FakeEvent.now = 10.0  # when the device is done with what was queued before step 1
    for step, x in enumerate(mon.timed(loader()), 1):
        FakeEvent.now += 1.0  # forward and backward on the device
        model(x).pow(2).mean().backward()
        FakeEvent.now += wait
        opt.step()
        opt.zero_grad()
        mon.log_step(step)
        FakeEvent.now = 10.0 * (step + 1)  # ... and with what was queued before the next
    assert mon.close(timeout=10)
    steps = sorted(receiver.of_kind("step"), key=lambda r: r["step"])
    assert [r["data_idle_time"] for r in steps] == pytest.approx(list(idle))
    assert all(r["data_time"] >= 0.02 for r in steps)
    for k in (1, 2, 3):  # step 1 learns which gradient comes last: no split
        span = 10.0 + idle[k] - idle[k - 1]
        assert steps[k]["compute_time"] == pytest.approx(span - idle[k] - wait)
    assert threading.current_thread().name not in FakeEvent.readers
