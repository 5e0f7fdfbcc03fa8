"""monitor_client: push per-step training health records to the monitor_agent sidecar.

A script makes a ``Monitor(url="http://127.0.0.1:9400", project="gpt", config=hparams)``
(``config``: the run's hyperparameters, a dict), calls ``mon.watch(model, optimizer,
grad_clip=1.0)`` in place of its ``clip_grad_norm_`` call, ``mon.log_step(step, loss=loss,
tokens=n_tokens)`` after each optimizer step, and ``mon.close()`` at the end (client/README.md has the whole loop; the docstring of
``monitor_client._monitor`` runs it against a stand-in sidecar).

Every other knob is a field of ``MonitorSettings`` / ``WatchSettings`` (``settings.py``),
passed as ``settings=``: ``Monitor(project="gpt", settings=MonitorSettings(linger=0.2,
watch=WatchSettings(activations=True)))``. Every error the client raises of its own is a
``MonitorClientError`` (``_errors.py``).

The public API is this package's ``__all__``::

    >>> import monitor_client
    >>> monitor_client.__all__
    ['CategoryLoss', 'Counters', 'DataStream', 'GuardSettings', 'Monitor', 'MonitorClientError',
     'MonitorSettings', 'RollbackPlan', 'WatchSettings']

with ``monitor_client.settings``, the framework callbacks ``monitor_client.hf`` and
``monitor_client.lightning``, and ``monitor_client.relaunch`` (``python -m monitor_client.relaunch``: the launcher side
of those callbacks' rollback exit); the modules whose names start with ``_`` are the
implementation and may change in any release. Importing this package does not import
torch; ``hf`` and ``lightning`` import their frameworks only when used.
"""

from monitor_client._categories import CategoryLoss
from monitor_client._counters import Counters
from monitor_client._data import DataStream
from monitor_client._errors import MonitorClientError
from monitor_client._monitor import Monitor
from monitor_client._rollback import RollbackPlan
from monitor_client.settings import GuardSettings, MonitorSettings, WatchSettings

__all__ = ["CategoryLoss", "Counters", "DataStream", "GuardSettings", "Monitor",
           "MonitorClientError", "MonitorSettings", "RollbackPlan", "WatchSettings"]
__version__ = "0.1.0"
