"""One base error: every exception class of the client derives from ``MonitorClientError``
and keeps the builtin base a caller catches (the one exit, ``RollbackExit``, excepted)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import monitor_client
from monitor_client import Monitor, MonitorClientError, MonitorSettings, WatchSettings
from monitor_client._resume import RollbackExit
from monitor_client._spool import SpoolUnsafe, private_directory

# Importing these needs their framework; they define no exception class.
NEEDS_A_FRAMEWORK = {"hf", "lightning"}


def _exception_classes() -> dict[str, type[BaseException]]:
    found = {}
    for info in pkgutil.iter_modules(monitor_client.__path__):
        if info.name in NEEDS_A_FRAMEWORK:
            continue
        module = importlib.import_module(f"monitor_client.{info.name}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == module.__name__:
                found[f"{info.name}.{name}"] = cls
    return found


def test_every_exception_class_of_the_client_is_a_monitor_client_error():
    classes = _exception_classes()
    assert "_spool.SpoolUnsafe" in classes and "_resume.RollbackExit" in classes
    outside = sorted(name for name, cls in classes.items()
                     if not issubclass(cls, MonitorClientError))
    assert outside == ["_resume.RollbackExit"]  # an exit: no except Exception may catch it
    assert not issubclass(RollbackExit, Exception) and issubclass(RollbackExit, SystemExit)


@pytest.mark.parametrize(("build", "builtin"), [
    (lambda: WatchSettings(hist_every=-1), ValueError),
    (lambda: MonitorSettings(linger="soon"), TypeError),
    (lambda: Monitor(config=["lr"]), TypeError),
    (lambda: Monitor(project="q", settings=MonitorSettings(project="p", enabled=False)),
     TypeError),
])
def test_a_refused_setting_is_both_the_builtin_and_the_clients_error(build, builtin):
    with pytest.raises(MonitorClientError) as caught:
        build()
    assert isinstance(caught.value, builtin)


def test_an_unsafe_spool_is_an_os_error_and_the_clients(tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    with pytest.raises(SpoolUnsafe) as caught:
        private_directory(not_a_directory)
    assert isinstance(caught.value, OSError) and isinstance(caught.value, MonitorClientError)
