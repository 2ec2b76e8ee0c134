"""The Gradio page of MetaSD Studio, below app.py (which only composes it and serves it).

    config      what the machine and the operator decide: concurrency, limits, defaults, examples
    server      Server: everything requests share (models, the line, stops, caches, temp dir), bound into handlers
    session     per-session pieces: the stop registry, whether a stream is read, the record of a run
    bundles     Presets, the loaded presets of a server, and the target alone timed through the server's slots
    errors      what a user is told when a request is refused or fails
    files       AppFiles, a server's private temp dir: run logs and CSV downloads; size-checked uploads
    frames      the views one run draws (token view, figures, numbers), live or replayed
    generate    Generate tab handlers        compare     Compare tab handlers
    replay      Replay tab handlers          playground  Bandit playground handler
    text        the page's long texts (explanations, captions, the keyboard script)
    tabs        one builder function per tab: components and their event wiring to the bound handlers

Handlers take the server as their first parameter; no module here keeps state of its own.
"""

import os

# The app never phones home: gradio reads this at import time, and every module here imports gradio.
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
