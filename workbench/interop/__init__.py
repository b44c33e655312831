"""Other libraries on the workbench's bench, each an optional extra imported only by its own module:
``workbench.interop.kvpress`` (``pip install -e .[kvpress]``) wraps NVIDIA kvpress's presses as policies.
The main suite never imports them (``tests/peers/`` does, in the peer environment)."""
