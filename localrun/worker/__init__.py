"""Worker processes: one per loaded in-process model (llama.cpp, MLX).

A native crash, abort or OOM kill then takes down one model, never the server; unloading
frees memory for real because the process ends. ``ops`` says what crosses the pipe (framed
by :mod:`localrun.frames`), ``main`` runs inside the worker, ``host`` is the parent's handle on it.
"""
