"""The trace-replay simulator: the real index and policies on a virtual clock."""
