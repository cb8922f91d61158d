"""`vllm.general_plugins` entry point used by probe_plugin.py.

vLLM calls every function registered under the entry-point group
"vllm.general_plugins" in every process (main: EngineArgs.__post_init__,
engine core: EngineCore.__init__, worker: WorkerWrapperBase) before the
connector class is resolved. register_connector() raises ValueError on a
duplicate name, so guard it (plugins may be loaded more than once).
"""
import os


def register() -> None:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    name = "ProbeConnector"
    if name not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector(name, "probe_kv_connector", "ProbeConnector")
    print(f"[probe plugin] registered {name} in pid {os.getpid()}", flush=True)
