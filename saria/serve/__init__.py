"""One cache per node: ``saria serve`` (server), its protocol and its client."""
