"""The whole-stack fault simulation (issue 31): real saria code, a vLLM
double, faults drawn from a seed.

One process drives several engines, each: vLLM's scheduler and block pool
(``vllm_double.py``: prefix cache, allocation, chunked prefill, preemption,
aborts, vLLM 0.32's handling of invalid blocks), saria's real
``SariaScheduler`` over a real ``TieredCache`` (DRAM pool, O_DIRECT SSD store
and journal in a temporary folder, SSD writes landed when the schedule says),
and one real ``SariaWorker`` per tensor-parallel rank copying into CPU KV
page tensors. A "forward" writes into every page the bytes derived from its
block's token prefix (``pages.py``), so a page that holds anything else --
stale bytes of another block, a slot reused under a copy, a load that never
ran -- is seen at the step that attends to it.

``world.py`` runs a list of events (``events.py`` draws it from a seed; a
failing list shrinks to a minimal one), checks after every step, and at the
end drains, checks for leaks and restarts every engine on its drive.
``mutations.py`` puts known bugs back, to show the simulation finds them.
"""
