"""monitor_client: push per-step training health records to the monitor_agent sidecar.

Example::

    import monitor_client
    mon = monitor_client.Monitor(url="http://127.0.0.1:9400", project="gpt", config={"lr": 3e-4})
    mon.watch(model, optimizer, grad_clip=1.0)
    mon.log_step(step, loss=loss, tokens=n_tokens)
    mon.close()

The knobs as one value: ``Monitor(config=MonitorConfig(project="gpt", hparams={...},
watch=WatchConfig(grad_clip=1.0)))`` (see ``config.py``).

Importing this package does not import torch; ``monitor_client.hf`` and
``monitor_client.lightning`` import their frameworks only when used.
"""

from monitor_client.categories import CategoryLoss
from monitor_client.config import MonitorConfig, WatchConfig
from monitor_client.counters import Counters
from monitor_client.monitor import Monitor

__all__ = ["CategoryLoss", "Counters", "Monitor", "MonitorConfig", "WatchConfig"]
__version__ = "0.1.0"
