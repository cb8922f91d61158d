"""saria in serving engines: the vLLM KV connector (``saria.connector.vllm``).

``config`` (settings), ``layout`` (page geometry), ``meta`` (per-step messages),
``scheduler`` and ``worker`` (the two roles), ``events`` and ``stats``.
Importing this package does not import vLLM; its submodules do.
"""
