"""Run: load a model (``models``), build a prompt with its spans (``prompt``, ``spans``, ``examples``),
greedy decoding with one stop rule (``generate``). ``adapter`` holds every contact with transformers
internals."""
